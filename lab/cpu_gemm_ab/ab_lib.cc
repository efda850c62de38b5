// The A/B library's driver: runs one variant's tile kernel over a whole M x K x N problem (erf GELU, bias) on
// `threads` std::threads that take tiles dynamically, as the op does on ORT's pool, and returns the wall time.
// VARIANTS (a list of V(name)) and TM_<name>, TN_<name> (tile rows and columns) come from build.sh.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "cpu/gemm/packed_gemm.h"

using onnxfuse::cpu::FusedTile;

extern "C" {
#define V(n) void n(const void*);
VARIANTS
#undef V
}

namespace {

struct Variant {
  const char* name;
  void (*tile)(const void*);
  int64_t tile_m, tile_n;
};

const std::vector<Variant> kVariants = {
#define V(n) {#n, n, TM_##n, TN_##n},
    VARIANTS
#undef V
};

double RunProblem(const Variant& v, int threads, int64_t M, int64_t K, int64_t N, const float* x,
                  const float* packed_w, const float* bias, float* y) {
  const int64_t tile_m = std::min(v.tile_m, M), tile_n = std::min(v.tile_n, N);
  const int64_t tiles_n = (N + tile_n - 1) / tile_n, count = ((M + tile_m - 1) / tile_m) * tiles_n;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t t; (t = next++) < count;) {
      const int64_t m0 = t / tiles_n * tile_m, n0 = t % tiles_n * tile_n;
      const FusedTile tile{x + m0 * K, K, packed_w, K, N, std::min(tile_m, M - m0), n0, std::min(tile_n, N - n0),
                           y + m0 * N + n0, N, bias, onnxfuse::Activation::kGeluErf, 1.702f};
      v.tile(&tile);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> helpers;
  for (int i = 1; i < threads; ++i) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

extern "C" int ab_count() { return static_cast<int>(kVariants.size()); }
extern "C" const char* ab_name(int i) { return kVariants[i].name; }
extern "C" int64_t ab_packed_floats(int64_t K, int64_t N) { return onnxfuse::cpu::PackedWeightFloats(K, N); }
// W is [N, K]; `out` must be 64-byte aligned.
extern "C" void ab_pack(const float* w_nk, int64_t K, int64_t N, float* out) {
  onnxfuse::cpu::PackWeightPanels(w_nk, true, K, N, 0, (N + 15) / 16, out);
}
extern "C" double ab_run(int i, int threads, int64_t M, int64_t K, int64_t N, const float* x, const float* packed_w,
                         const float* bias, float* y) {
  return RunProblem(kVariants[i], threads, M, K, N, x, packed_w, bias, y);
}
