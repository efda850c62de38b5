// The custom-op domain and op name. onnxfuse/domain.py holds the same facts for Python;
// tests/test_domain.py checks that the two agree.
#pragma once

namespace onnxfuse {

inline constexpr const char* kDomain = "ai.onnxfuse";
inline constexpr const char* kOpType = "FusedLinearGelu";
inline constexpr int kOpVersion = 1;

}  // namespace onnxfuse
