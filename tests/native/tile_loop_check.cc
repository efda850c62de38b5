// The packed GEMM's tile loop with several panels per micro-kernel call (the AVX-512 build runs four) checked
// on any AVX2 machine: Tile<Avx2, 4> must give bit-identical results to Tile<Avx2, 1> (the same sums in the
// same order) over widths made of wide groups, single panels and a ragged last panel, at tile offsets, and
// both must match a float64 reference and leave columns outside the tile untouched.
// Built and run by tests/test_cpu_tile_loop.py. Exit 0: all good; 1: a mismatch (printed); 77: no AVX2.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/gemm/packed_gemm.h"
#include "cpu/gemm/packed_gemm_kernel.h"
#include "cpu/simd/simd_avx2.h"

using namespace onnxfuse::cpu;
using S = onnxfuse::cpu::simd::Avx2;
constexpr auto kErf = onnxfuse::Activation::kGeluErf;

int main() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 77;
  std::srand(7);
  auto uniform = [] { return (std::rand() % 2001) / 1000.0f - 1.0f; };
  int bad = 0, cases = 0;
  for (int64_t M : {1, 5, 6, 7, 13, 128}) {
    for (int64_t K : {1, 17, 256, 257, 600}) {
      for (int64_t N : {16, 40, 64, 80, 100, 130, 279}) {
        std::vector<float> x(M * K), w(N * K), b(N);
        for (auto& v : x) v = uniform();
        for (auto& v : w) v = uniform();
        for (auto& v : b) v = uniform();
        AlignedFloats packed = AllocateAligned(PackedWeightFloats(K, N));
        PackWeightPanels(w.data(), /*trans_b=*/true, K, N, 0, (N + kPanelWidth - 1) / kPanelWidth, packed.get());
        for (int64_t n0 : {int64_t{0}, int64_t{16}}) {
          if (n0 >= N) continue;
          ++cases;
          std::vector<float> one(M * N, -7.0f), four(M * N, -7.0f);
          FusedTile t{x.data(), K, packed.get(), K, N, M, n0, N - n0, one.data() + n0, N, b.data(), kErf, 1.702f};
          gemm_kernel::Tile<S, 1, 256, kErf>(t);
          t.c = four.data() + n0;
          gemm_kernel::Tile<S, 4, 256, kErf>(t);
          if (std::memcmp(one.data(), four.data(), sizeof(float) * one.size()) != 0) {
            ++bad;
            std::printf("4-panel result differs: M=%ld K=%ld N=%ld n0=%ld\n", long(M), long(K), long(N), long(n0));
          }
          double worst = 0.0;
          bool outside = false;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              const float got = one[i * N + j];
              if (j < n0) {
                outside |= got != -7.0f;
                continue;
              }
              double z = b[j];
              for (int64_t k = 0; k < K; ++k) z += double(x[i * K + k]) * double(w[j * K + k]);
              const double gelu = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
              worst = std::max(worst, std::abs(gelu - got) / (1.0 + std::abs(gelu)));
            }
          }
          if (worst > 1e-5 || outside) {
            ++bad;
            std::printf("wrong: M=%ld K=%ld N=%ld n0=%ld worst rel err %.3g%s\n", long(M), long(K), long(N),
                        long(n0), worst, outside ? ", wrote outside the tile" : "");
          }
        }
      }
    }
  }
  std::printf("%d cases, %d bad\n", cases, bad);
  return bad == 0 ? 0 : 1;
}
