// StepData: the integer inputs of one forward (token ids, positions, sequence bounds, state
// slots, page tables, the rows that need logits), packed once per step into one block and made
// visible to the kernels in one transfer. Kernels read them as tensors, never as host vectors.
//
// The block is sized by the largest step seen so far and grows only between steps (one counted
// allocation), so a serving engine packs every decode step into the same memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

struct StepShape {
  int64_t tokens = 0;      // T: rows of the flattened batch
  int64_t seqs = 0;        // B
  int64_t logit_rows = 0;  // R
  int64_t page_cols = 0;   // P: width of the page table (the longest sequence's pages)
};

class StepData {
 public:
  // On a GPU the views below are filled on the host and mirrored into a device block of the same
  // layout by publish(); kernels read the mirror (on_device).
  explicit StepData(Device device = Device::kCpu);

  // Sizes the block for the largest step the caller will run (the engine: its token budget, its
  // sequence limit and the pages of its longest context), so no later step grows it.
  void reserve(const StepShape& largest);
  // Lays out the views below for `shape` (contents undefined until filled).
  void begin(const StepShape& shape);
  // Makes the filled views visible to the kernels: on a GPU one asynchronous host-to-device copy
  // of the packed block on `ex`'s stream (staged before it returns, so the views may be refilled
  // for the next step at once); on the host the packing itself is the transfer. Counted.
  void publish(const Exec& ex);
  // Called with publish()'s Exec just before its copy is enqueued: the step's first device work
  // in a decode step (the engine's DeviceStepClock marks its start there). Empty: nothing.
  void set_before_publish(std::function<void(const Exec&)> hook) {
    before_publish_ = std::move(hook);
  }
  // The tensor the kernels read for `field` (one of the views below): the view itself on the
  // host, its mirror in the device block on a GPU.
  Tensor on_device(const Tensor& field) const;
  Device device() const { return device_; }

  // Host views, filled by the caller between begin() and publish().
  Tensor token_ids;    // i32 [T]
  Tensor positions;    // i64 [T] absolute position of each row
  Tensor logit_rows;   // i64 [R] rows whose logits are computed, in sequence order
  Tensor cu_seqlens;   // i64 [B + 1] first row of each sequence, then T
  Tensor past_lens;    // i64 [B] positions each sequence already had cached
  Tensor state_slots;  // i32 [B] linear-attention state slot (-1: the model has no linear layer)
  // i32 [B, P] page ids per sequence, padded past its last page with CacheStore::kScratchPage
  // (never handed to a request in the engine's store), so a padded entry can only reach scratch.
  Tensor page_table;

  uint64_t transfers() const { return transfers_; }
  size_t capacity_bytes() const { return capacity_; }

 private:
  static size_t bytes_for(const StepShape& shape);

  Device device_;
  std::function<void(const Exec&)> before_publish_;
  std::shared_ptr<void> block_;         // host: the packed views
  std::shared_ptr<void> device_block_;  // GPU: the mirror the kernels read
  size_t used_ = 0;                     // bytes of the current step's layout
  size_t capacity_ = 0;
  uint64_t transfers_ = 0;
};

}  // namespace loom
