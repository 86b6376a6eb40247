#include "core/workspace.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"

namespace loom {
namespace {
constexpr size_t kAlign = 256;  // every view starts on a 256-byte boundary (CUDA, AVX-512)
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Workspace::Workspace(Device device, size_t initial_bytes) : device_(device) {
  if (initial_bytes > 0) {
    capacity_ = round_up(initial_bytes);
    block_ = allocate_buffer(capacity_, device_);
  }
}

Tensor Workspace::take(Shape shape, DType dtype) {
  const size_t bytes = round_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  const size_t begin = offset_;
  offset_ += bytes;
  high_water_ = std::max(high_water_, offset_);
  if (offset_ <= capacity_) {
    return Tensor::wrap(static_cast<char*>(block_.get()) + begin, shape, dtype, device_, block_);
  }
  // Does not fit: serve it alone (the step stays correct) and grow at the next reset().
  ++overflows_;
  std::shared_ptr<void> own = allocate_buffer(bytes, device_);
  void* p = own.get();
  return Tensor::wrap(p, shape, dtype, device_, std::move(own));
}

Tensor Workspace::take_zeros(Shape shape, DType dtype) {
  LOOM_CHECK(device_.is_cpu(), "Workspace::take_zeros is host-only (workspace on %s)",
             device_name(device_).c_str());
  Tensor t = take(shape, dtype);
  if (t.nbytes() > 0) std::memset(t.raw(), 0, t.nbytes());
  return t;
}

void Workspace::reset() {
  offset_ = 0;
  if (high_water_ > capacity_) {
    block_.reset();  // views of the old block keep it alive until they die
    capacity_ = high_water_;
    block_ = allocate_buffer(capacity_, device_);
  }
}

}  // namespace loom
