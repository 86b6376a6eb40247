// Workspace: one device allocation carved into the temporaries of a step, so that the per-step
// path allocates nothing and addresses repeat from step to step (what CUDA graph capture needs).
//
// take() hands out aligned views by bumping an offset; a Workspace::Mark restores the offset when
// it goes out of scope, so each layer reuses the memory of the layer before. Kernels on one CUDA
// stream run in issue order, so reusing a region for a later kernel is safe without a sync.
//
// Sizing: a request that does not fit is served from a fresh allocation (counted in
// overflow_allocations()) and raises the high-water mark; the next reset() grows the block to
// the mark, between steps. The engine runs one measuring step at its largest batch at start-up,
// so serving steps never overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace loom {

class Workspace {
 public:
  explicit Workspace(Device device, size_t initial_bytes = 0);
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  Device device() const { return device_; }

  // A contiguous, uninitialised tensor valid until the enclosing Mark ends or reset().
  Tensor take(Shape shape, DType dtype = DType::kF32);
  // A zero-filled one (host only).
  Tensor take_zeros(Shape shape, DType dtype = DType::kF32);

  // Restores the carving offset when destroyed: views taken inside its scope are dead after it.
  class Mark {
   public:
    explicit Mark(Workspace& ws) : ws_(ws), offset_(ws.offset_) {}
    ~Mark() { ws_.offset_ = offset_; }
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;

   private:
    Workspace& ws_;
    size_t offset_;
  };

  // Starts a step: every earlier view is dead; grows the block to the high-water mark if the last
  // step overflowed (the one allocation outside the measuring step).
  void reset();

  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }  // most bytes live at once, ever
  uint64_t overflow_allocations() const { return overflows_; }

 private:
  Device device_;
  std::shared_ptr<void> block_;
  size_t capacity_ = 0;
  size_t offset_ = 0;
  size_t high_water_ = 0;
  uint64_t overflows_ = 0;
};

}  // namespace loom
