// The custom-op domain, its opset version, and each op's name and since-version. onnxfuse/domain.py holds the
// same facts for Python; tests/test_domain.py checks that the two agree.
#pragma once

namespace onnxfuse {

inline constexpr const char* kDomain = "ai.onnxfuse";
inline constexpr int kDomainVersion = 3;  // the opset version models import

inline constexpr const char* kOpType = "FusedLinearGelu";
inline constexpr int kOpSinceVersion = 1;  // FusedLinearGelu exists since version 1 of the domain

inline constexpr const char* kFillMaskedRowsOpType = "FillMaskedRows";
inline constexpr int kFillMaskedRowsSinceVersion = 2;  // FillMaskedRows exists since version 2

inline constexpr const char* kMaskedSkipNormOpType = "MaskedSkipLayerNormalization";
inline constexpr int kMaskedSkipNormSinceVersion = 3;  // MaskedSkipLayerNormalization exists since version 3

}  // namespace onnxfuse
