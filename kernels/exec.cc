#include "kernels/exec.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/context.h"
#include "kernels/cuda/device.h"
#endif

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

absl::StatusOr<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  constexpr std::string_view kPrefix = "cuda:";
  if (name.size() > kPrefix.size() && name.substr(0, kPrefix.size()) == kPrefix) {
    const std::string_view digits = name.substr(kPrefix.size());
    int index = 0;
    if (digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string_view::npos &&
        absl::SimpleAtoi(absl_sv(digits), &index))
      return Device::cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", absl_sv(name), "': expected cpu, cuda or cuda:N"));
}

absl::Status device_available(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
#ifdef LOOM_WITH_CUDA
  const int visible = cuda::visible_devices();
  if (device.index < visible) {
    cuda::init();  // registers the device allocator and copier before anything allocates there
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("device ", device_name(device),
                                                 ": this machine shows ", visible, " CUDA device",
                                                 visible == 1 ? "" : "s"));
#else
  return absl::InvalidArgumentError(absl::StrCat(
      "device ", device_name(device),
      ": this build has no CUDA backend (configure with the cuda preset: cmake --preset cuda)"));
#endif
}

absl::StatusOr<DeviceMemory> device_memory(Device device) {
  if (device.is_cpu())
    return absl::InvalidArgumentError("device_memory: the host's memory is not a device's");
  if (absl::Status st = device_available(device); !st.ok()) return st;
#ifdef LOOM_WITH_CUDA
  DeviceMemory m;
  cuda::memory_info(device.index, &m.free_bytes, &m.total_bytes);
  return m;
#else
  return absl::InvalidArgumentError("device_memory: this build has no CUDA backend");
#endif
}

Exec exec_for(Device device, Workspace* workspace) {
  if (device.is_cpu()) {
    Exec ex;
    ex.workspace = workspace;
    return ex;
  }
#ifdef LOOM_WITH_CUDA
  return cuda::device_exec(device.index, workspace);
#else
  LOOM_CHECK(false, "exec_for(%s): this build has no CUDA backend", device_name(device).c_str());
  std::abort();
#endif
}

namespace {

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// The stream-ordered copies below: a memcpy on the host, cudaMemcpyAsync on ex's stream on a GPU,
// followed by a wait for the stream when `wait`.
void copy_on_stream(const Exec& ex, void* dst, const void* src, size_t bytes, CopyKind kind,
                    bool wait, const char* op) {
  if (bytes == 0) return;
  if (ex.device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef LOOM_WITH_CUDA
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  const cudaStream_t stream = cuda::stream_of(ex);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, stream));
  if (wait) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)kind;
  (void)wait;
  no_kernel_for(ex, op);
#endif
}

}  // namespace

void upload_async(const Exec& ex, void* dst, const void* src, size_t bytes) {
  copy_on_stream(ex, dst, src, bytes, CopyKind::kHostToDevice, false, "upload_async");
}

void download(const Exec& ex, void* dst, const void* src, size_t bytes) {
  copy_on_stream(ex, dst, src, bytes, CopyKind::kDeviceToHost, true, "download");
}

void download_async(const Exec& ex, void* dst, const void* src, size_t bytes) {
  copy_on_stream(ex, dst, src, bytes, CopyKind::kDeviceToHost, false, "download_async");
}

void copy_async(const Exec& ex, void* dst, const void* src, size_t bytes) {
  copy_on_stream(ex, dst, src, bytes, CopyKind::kDeviceToDevice, false, "copy_async");
}

void copy_batch_async(const Exec& ex, void* const* dsts, const void* const* srcs,
                      const size_t* sizes, size_t n) {
  if (ex.device.is_cpu()) {
    for (size_t i = 0; i < n; ++i) std::memcpy(dsts[i], srcs[i], sizes[i]);
    return;
  }
#ifdef LOOM_WITH_CUDA
  constexpr size_t kMaxBatch = 16384;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // after the stream's earlier work
  size_t attr_index = 0;
  for (size_t i = 0; i < n; i += kMaxBatch) {
    const size_t count = std::min(kMaxBatch, n - i);
    LOOM_CUDA_CHECK(cudaMemcpyBatchAsync(dsts + i, srcs + i, sizes + i, count, &attr, &attr_index,
                                         1, cuda::stream_of(ex)));
  }
#else
  (void)dsts;
  (void)srcs;
  (void)sizes;
  (void)n;
  no_kernel_for(ex, "copy_batch_async");
#endif
}

void synchronize(const Exec& ex) {
  if (ex.device.is_cpu()) return;
#ifdef LOOM_WITH_CUDA
  LOOM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream_of(ex)));
#else
  no_kernel_for(ex, "synchronize");
#endif
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
