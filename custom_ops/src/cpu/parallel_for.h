// ParallelFor: a loop on ORT's intra-op thread pool for the CPU kernels, with exceptions kept on the
// calling thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>

#include <onnxruntime_cxx_api.h>

namespace onnxfuse::cpu {

// Runs fn(i) for i in [0, count) on ORT's intra-op pool. The first exception a task throws is kept and
// rethrown on the calling thread: nothing escapes into ORT's threads.
template <typename Fn>
void ParallelFor(const Ort::KernelContext& ctx, int64_t count, Fn&& fn) {
  if (count <= 0) return;
  struct Shared {
    Fn* fn;
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex mutex;
  } shared;
  shared.fn = &fn;
  auto task = [](void* data, size_t i) {
    auto* s = static_cast<Shared*>(data);
    if (s->failed.load(std::memory_order_relaxed)) return;
    try {
      (*s->fn)(static_cast<int64_t>(i));
    } catch (...) {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (!s->failed.exchange(true)) s->error = std::current_exception();
    }
  };
  if (count == 1) {
    task(&shared, 0);
  } else {
    ctx.ParallelFor(task, static_cast<size_t>(count), 0, &shared);
  }
  if (shared.error) std::rethrow_exception(shared.error);
}

}  // namespace onnxfuse::cpu
