#include "scheduler/cache_sizing.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"

namespace loom {

absl::StatusOr<CacheSizing> cache_sizing_compute(const CacheSizingInput& in) {
  if (in.page_size <= 0 || in.max_num_seqs <= 0 || in.budget_bytes < 0 ||
      in.state_bytes_per_slot < 0 || in.num_checkpoint_slots < -1) {
    return absl::InvalidArgumentError("cache sizing: negative or zero size");
  }
  int64_t kv_per_token = 0;
  for (int64_t b : in.kv_bytes_per_token) {
    if (b < 0) return absl::InvalidArgumentError("cache sizing: negative kv bytes");
    kv_per_token += b;
  }
  CacheSizing out;
  if (in.state_bytes_per_slot > 0) {
    const int64_t ckpt = in.num_checkpoint_slots < 0 ? in.max_num_seqs : in.num_checkpoint_slots;
    const int64_t slots = 1 + int64_t{in.max_num_seqs} + ckpt;
    if (slots > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError("cache sizing: too many slots");
    }
    out.num_state_slots = static_cast<int32_t>(slots);
  }
  const int64_t slot_bytes = int64_t{out.num_state_slots} * in.state_bytes_per_slot;
  if (slot_bytes > in.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cache sizing: %d state slots need %d bytes, budget is %d",
                        out.num_state_slots, slot_bytes, in.budget_bytes));
  }
  if (kv_per_token > 0) {
    out.page_bytes = kv_per_token * in.page_size;
    const int64_t pages = (in.budget_bytes - slot_bytes) / out.page_bytes;
    if (pages < 2) {  // the scratch page and one a request can hold
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cache sizing: budget %d leaves no room for one %d-byte page beside the scratch page",
          in.budget_bytes, out.page_bytes));
    }
    out.num_pages =
        static_cast<int32_t>(std::min<int64_t>(pages, std::numeric_limits<int32_t>::max()));
  }
  out.used_bytes = int64_t{out.num_pages} * out.page_bytes + slot_bytes;
  return out;
}

}  // namespace loom
