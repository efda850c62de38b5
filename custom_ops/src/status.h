// The API boundary of every op in the library: no exception may cross ORT's C API, so each entry point
// runs its body through GuardOpStatus, which turns what it throws into an OrtStatus* naming the op.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>

#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

// Runs `fn`; nullptr on success, else a status whose message is prefixed with `op` (an Ort::Exception
// keeps its error code, anything else is ORT_FAIL).
template <typename Fn>
OrtStatus* GuardOpStatus(const char* op, Fn&& fn) noexcept {
  const auto message = [op](const char* what) { return std::string(op) + ": " + what; };
  try {
    fn();
    return nullptr;
  } catch (const Ort::Exception& e) {
    return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), message(e.what()).c_str());
  } catch (const std::bad_alloc&) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, message("out of memory").c_str());
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, message(e.what()).c_str());
  } catch (...) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, message("unknown error").c_str());
  }
}

}  // namespace onnxfuse
