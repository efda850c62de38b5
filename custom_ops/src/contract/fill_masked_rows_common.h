// FillMaskedRows: Y = X, except that each row none of whose flags is set holds `fill` in every element.
//
//   X        [B, S, D] float32, float16 or bfloat16
//   row_kept [B, S|1, K] or [B, 1, S|1, K] bool, K >= 1: row (b, s) is kept when any of its K flags is set
//            (one flag per row, or one set for all rows of a batch entry). K = 1 is Where(row_kept, X, fill);
//            K = the keys, in the attention mask's own layout [B, 1, S|1, T], keeps the query rows that see
//            at least one key, which is what the attention rule needs.
//   fill     float attribute (default 0), converted to X's type
//
// It is the attention rule's row guard (onnxfuse/patterns/attention/plan.py writes it): a query row that sees
// no key is NaN in the graph and 0 after sdpa's IsNaN guard, while the fused attention op's output for such a
// row is the kernel's own. ONNX's Where(any(keep), X, fill) says the same, but takes four more nodes to reduce
// the mask and reads and writes every element of X (its cost against this op's: bench/results/e2e_h200.md,
// "The row guard on the mask itself").
// This op may write its output into X's buffer (OrtCustomOp::GetMayInplace): where ORT grants that, a call
// touches only the flags and the rows that are filled, almost always none. Where it does not, the call
// copies the kept rows.
//
// What both providers' kernels share: the shapes' validation and the fill's bit pattern per type.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

struct MaskedRowsShape {
  int64_t batch = 0;       // B
  int64_t rows = 0;        // S
  int64_t flag_rows = 0;   // S or 1: row_kept's row axis
  int64_t flags_per_row = 0;  // K: row_kept's last axis
  int64_t width = 0;       // D
  int64_t element_bytes = 0;
};

// Checks X [B, S, D] of a float type and row_kept [B, S|1, K] or [B, 1, S|1, K] bool. Throws Ort::Exception
// (ORT_INVALID_ARGUMENT) naming the input otherwise.
MaskedRowsShape ValidateMaskedRows(const std::vector<int64_t>& x_shape, ONNXTensorElementDataType x_type,
                                   const std::vector<int64_t>& kept_shape, ONNXTensorElementDataType kept_type);

// Reads the `fill` attribute (0 when absent).
float ReadFillAttribute(const OrtKernelInfo* info);

// `fill` as an element of `type`, in the low bits (float32: 32 bits; float16/bfloat16: 16, rounded to
// nearest even, NaN kept NaN).
uint32_t FillBits(float fill, ONNXTensorElementDataType type);

// Says once per node, in ORT's log at the verbose level, whether ORT gave Y the buffer of X (a call then
// touches only the flags and the rows it fills) or a buffer of its own (a call copies every kept row): what
// shows a user, and the tests, whether the planner granted the in-place reuse. Seen with the session's or
// the run's log_severity_level at 0.
class InPlaceReport {
 public:
  explicit InPlaceReport(const OrtKernelInfo* info);
  void Note(const Ort::KernelContext& context, bool in_place);

 private:
  const std::string node_;
  std::atomic<bool> said_{false};
};

// What every instance of the op (one per element type and provider) sets in place of CustomOpBase's
// defaults: output 0 may reuse input 0's buffer (GetMayInplace), and Y's type and shape are X's
// (InferOutputShapeFn). ORT's planner reuses a buffer only where it can prove the two tensors the same size,
// from the shapes inference gives, so both are needed for the in-place call.
template <typename TOp>
void DeclareOutputIsInput(TOp& op) {
  op.OrtCustomOp::GetMayInplace = [](int** input_index, int** output_index) -> size_t {
    *input_index = new int[1]{0};
    *output_index = new int[1]{0};
    return 1;
  };
  op.OrtCustomOp::ReleaseMayInplace = [](int* input_index, int* output_index) {
    delete[] input_index;
    delete[] output_index;
  };
  op.OrtCustomOp::InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) -> OrtStatusPtr {
    const OrtApi& api = Ort::GetApi();
    OrtTensorTypeAndShapeInfo* x = nullptr;  // owned by the context
    if (OrtStatusPtr status = api.ShapeInferContext_GetInputTypeShape(ctx, 0, &x)) return status;
    // Y takes X's shape only where each of its 3 dims is a number or a symbol: an unknown dim reads as -1
    // here and would be written back as the size -1. X with no shape known reads as rank 0. Otherwise Y
    // keeps the type ORT gave it (and the call may not run in place).
    size_t rank = 0;
    if (OrtStatusPtr status = api.GetDimensionsCount(x, &rank)) return status;
    if (rank != 3) return nullptr;
    int64_t dims[3];
    const char* symbols[3] = {nullptr, nullptr, nullptr};
    if (OrtStatusPtr status = api.GetDimensions(x, dims, 3)) return status;
    if (OrtStatusPtr status = api.GetSymbolicDimensions(x, symbols, 3)) return status;
    for (int i = 0; i < 3; ++i) {
      if (dims[i] < 0 && (symbols[i] == nullptr || symbols[i][0] == '\0')) return nullptr;
    }
    return api.ShapeInferContext_SetOutputTypeShape(ctx, 0, x);
  };
}

}  // namespace onnxfuse
