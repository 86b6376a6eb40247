#include "kernels/exec.h"

#include <string>

namespace loom {

const Exec& host_exec() {
  static const Exec kHost;
  return kHost;
}

void check_exec_device(const Exec& ex, const char* op, const char* names,
                       std::initializer_list<const Tensor*> args) {
  for (const Tensor* t : args) {
    if (!t->defined() || t->device() == ex.device) continue;
    std::string all;
    for (const Tensor* u : args) all += (all.empty() ? "" : ", ") + u->describe();
    LOOM_CHECK(false,
               "%s: runs on %s but an argument is on %s (arguments %s: %s); every tensor of an op "
               "must live on its execution device",
               op, device_name(ex.device).c_str(), device_name(t->device()).c_str(), names,
               all.c_str());
  }
}

void no_kernel_for(const Exec& ex, const char* op) {
#ifdef LOOM_WITH_CUDA
  LOOM_CHECK(false, "%s: no %s kernel yet", op, device_name(ex.device).c_str());
#else
  LOOM_CHECK(false, "%s: %s tensors in a build without CUDA", op, device_name(ex.device).c_str());
#endif
  std::abort();
}

}  // namespace loom
