// The activation applied after X·W(ᵀ)+B, as named by the op's `approximate` attribute.
#pragma once

namespace onnxfuse {

enum class Activation : int {
  kGeluErf = 0,   // approximate="none":    0.5·x·(1 + erf(x/√2))
  kGeluTanh = 1,  // approximate="tanh":    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
  kSigmoid = 2,   // approximate="sigmoid": x·σ(alpha·x)   (QuickGELU, alpha 1.702)
};

}  // namespace onnxfuse
