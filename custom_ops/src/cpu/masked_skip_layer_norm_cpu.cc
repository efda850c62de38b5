// MaskedSkipLayerNormalization on the CPU: rows in blocks on ORT's intra-op pool; each row widened to float32,
// summed, normalized in two passes (mean, then the squared deviations) and narrowed once.
#include "cpu/masked_skip_layer_norm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "domain.h"
#include "contract/masked_skip_layer_norm_common.h"
#include "status.h"
#include "cpu/element_rows.h"
#include "cpu/parallel_for.h"
#include "cpu/simd/vector_kernels.h"

namespace onnxfuse::cpu {
namespace {

// Rows per task: enough work to pay a task's dispatch (a 768-wide row is about a microsecond).
constexpr int64_t kRowsPerTask = 16;

template <typename T>
class MaskedSkipNormCpuKernel {
 public:
  explicit MaskedSkipNormCpuKernel(const OrtKernelInfo* info)
      : epsilon_(ReadEpsilonAttribute(info)), vk_(CpuVectorKernels()) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardOpStatus(kMaskedSkipNormOpType, [&] { Compute(context); });
  }

 private:
  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const MaskedSkipNormTensors t = ReadMaskedSkipNormCall(ctx);
    const MaskedSkipNormShape& s = t.shape;
    const int64_t rows = s.rows.batch * s.rows.rows, d = s.rows.width;
    if (rows * d == 0) return;

    const T* x = static_cast<const T*>(t.input);
    const T* sk = static_cast<const T*>(t.skip);
    const bool* flags = t.row_kept;
    T* out = static_cast<T*>(t.y);
    T* sum_out = static_cast<T*>(t.sum);
    // gamma, beta and bias in float32 once a call: [gamma | beta | bias], absent ones 0 (beta, bias)
    std::vector<float> vectors(3 * d, 0.0f);
    ToFloat(vk_, static_cast<const T*>(t.gamma), vectors.data(), d);
    if (t.beta != nullptr) ToFloat(vk_, static_cast<const T*>(t.beta), vectors.data() + d, d);
    if (t.bias != nullptr) ToFloat(vk_, static_cast<const T*>(t.bias), vectors.data() + 2 * d, d);
    const float* g = vectors.data();
    const float* be = g + d;
    const float* bi = g + 2 * d;

    ParallelFor(ctx, (rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task) {
      std::vector<float> row(d), other(d);
      const int64_t end = std::min(rows, (task + 1) * kRowsPerTask);
      for (int64_t r = task * kRowsPerTask; r < end; ++r) {
        const int64_t b = r / s.rows.rows, q = r - b * s.rows.rows;
        const bool* row_flags =
            flags + (b * s.rows.flag_rows + (s.rows.flag_rows == 1 ? 0 : q)) * s.rows.flags_per_row;
        const bool row_kept = std::find(row_flags, row_flags + s.rows.flags_per_row, true) !=
                              row_flags + s.rows.flags_per_row;
        ToFloat(vk_, sk + (s.skip_per_batch ? r : q) * d, row.data(), d);
        if (row_kept) {
          // A row not kept never reads its input: what the attention left there (NaN too) counts for nothing.
          ToFloat(vk_, x + r * d, other.data(), d);
          for (int64_t i = 0; i < d; ++i) row[i] += other[i];
        }
        double total = 0.0;
        for (int64_t i = 0; i < d; ++i) {
          row[i] += bi[i];
          total += row[i];
        }
        const float mean = static_cast<float>(total / static_cast<double>(d));
        double squares = 0.0;
        for (int64_t i = 0; i < d; ++i) {
          const double dev = static_cast<double>(row[i]) - mean;
          squares += dev * dev;
        }
        const float inv_std = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(d)) + epsilon_);
        if (sum_out != nullptr) FromFloat(vk_, row.data(), sum_out + r * d, d);
        for (int64_t i = 0; i < d; ++i) other[i] = (row[i] - mean) * inv_std * g[i] + be[i];
        FromFloat(vk_, other.data(), out + r * d, d);
      }
    });
  }

  const float epsilon_;
  const VectorKernels& vk_;
};

template <typename T>
struct MaskedSkipNormCpuOp
    : Ort::CustomOpBase<MaskedSkipNormCpuOp<T>, MaskedSkipNormCpuKernel<T>, /*WithStatus=*/true> {
  MaskedSkipNormCpuOp() { this->start_ver_ = kMaskedSkipNormSinceVersion; }
  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardOpStatus(kMaskedSkipNormOpType, [&] { *kernel = new MaskedSkipNormCpuKernel<T>(info); });
  }
  const char* GetName() const { return kMaskedSkipNormOpType; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return kMaskedSkipNormInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return MaskedSkipNormInputType(index, kElementType<T>);
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return MaskedSkipNormInputCharacteristic(index);
  }
  size_t GetOutputTypeCount() const { return kMaskedSkipNormOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return MaskedSkipNormOutputCharacteristic(index);
  }
};

}  // namespace

void AddMaskedSkipNormCpuOps(Ort::CustomOpDomain& domain) {
  static MaskedSkipNormCpuOp<float> op_float32;
  static MaskedSkipNormCpuOp<Ort::Float16_t> op_float16;
  static MaskedSkipNormCpuOp<Ort::BFloat16_t> op_bfloat16;
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse::cpu
