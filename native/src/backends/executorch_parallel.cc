// The runner's executorch::extension::parallel_for, which takes the place of the wheel's
// (executorch.cmake exports it from the executable, and the kernel libraries the backend
// opens bind to it first).
//
// Why: ExecuTorch 1.5's parallel_for sizes its chunks by the global thread pool's thread
// count even under a NoThreadPoolGuard, so a CPU kernel over a range past its grain size
// (where.self_out) created the pool and its threads with EDGE_THREADS=1; under qemu-user
// those threads never start and the run hung. Under the guard the range now runs on the
// calling thread, as later ExecuTorch releases do; otherwise the wheel's own runs it.
#include <dlfcn.h>

#include <cstdint>

#include <executorch/extension/threadpool/threadpool_guard.h>
#include <executorch/runtime/core/function_ref.h>

namespace executorch::extension {

using Range = runtime::FunctionRef<void(int64_t, int64_t)>;

bool parallel_for(int64_t begin, int64_t end, int64_t grain_size, Range f) {
  if (threadpool::NoThreadPoolGuard::is_enabled()) {
    if (begin < 0 || end < begin || grain_size <= 0) return false;  // the wheel's checks
    if (begin < end) f(begin, end);
    return true;
  }
  using Wheel = bool (*)(int64_t, int64_t, int64_t, Range);
  static const auto wheel = reinterpret_cast<Wheel>(
      dlsym(RTLD_NEXT, "_ZN10executorch9extension12parallel_forElllNS_7runtime11FunctionRefIFvllEEE"));
  return wheel != nullptr && wheel(begin, end, grain_size, f);
}

}  // namespace executorch::extension
