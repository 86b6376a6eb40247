// Turns a byte budget into KV page and state slot counts. Pure arithmetic; the engine calls it with
// the model's numbers.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"

namespace loom {

struct CacheSizingInput {
  // Per-token KV bytes of each page-holding (attention) layer; a page id spans all of them, so a
  // page costs page_size * sum(kv_bytes_per_token).
  std::span<const int64_t> kv_bytes_per_token;
  int64_t state_bytes_per_slot = 0;  // one linear-attention state (all linear layers); 0: none
  int64_t budget_bytes = 0;          // memory for pages + slots
  int32_t page_size = 64;
  int32_t max_num_seqs = 256;  // one live slot each
  // Extra slots for prefix-cache checkpoints. -1: as many as max_num_seqs.
  int32_t num_checkpoint_slots = -1;
};

struct CacheSizing {
  int32_t num_pages = 0;        // incl. the scratch page 0; 0 when there are no attention layers
  int32_t num_state_slots = 0;  // incl. the scratch slot 0; 0 when there are no linear layers
  int64_t page_bytes = 0;
  int64_t used_bytes = 0;  // num_pages * page_bytes + num_state_slots * state_bytes_per_slot
};

// Slots are reserved first (1 scratch + max_num_seqs + checkpoint slots, exact); the remaining
// budget becomes pages, rounded down (a partial page is never counted), the scratch page among
// them. Attention-only models get no slots; linear-only models get no pages. ResourceExhausted if
// the budget does not cover the slots plus the scratch page and one page (or the slots, without
// attention); InvalidArgument on negative inputs.
absl::StatusOr<CacheSizing> cache_sizing_compute(const CacheSizingInput& input);

}  // namespace loom
