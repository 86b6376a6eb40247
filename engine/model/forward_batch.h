// ForwardBatch: the tokens of several sequences flattened into one varlen batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/workspace.h"
#include "engine/model/cache_store.h"
#include "engine/model/routing_replay.h"
#include "engine/model/sequence_cache.h"
#include "engine/model/step_data.h"

namespace loom {

enum class LogitsMode : uint8_t {
  kNone,  // no logits (a prefill chunk that is not the prompt's last)
  kLast,  // the sequence's last new token only (prefill end, decode)
  kAll,   // every new token (conformance, prompt logprobs)
};

// One sequence of the batch. Its cache is either a private SequenceCache (tools, tests) or a
// state slot and page table in the batch's CacheStore (the serving engine); a batch uses one kind
// for all its sequences.
struct SequenceInput {
  int64_t num_tokens = 0;  // new tokens, consecutive in ForwardBatch::token_ids
  LogitsMode logits = LogitsMode::kLast;

  SequenceCache* cache = nullptr;  // private cache: holds the earlier positions; extended in place

  // Store-backed: positions [0, start) are already in the store; this call writes
  // [start, start + num_tokens) into the pages of `pages` (which must cover them) and advances
  // the state in `slot`. The caller resets or restores the slot beforehand as needed.
  int64_t start = 0;
  int32_t slot = -1;  // linear-attention state slot (models with KDA/GDN layers)
  // Page table (models with attention layers): a view of the caller's table (the engine: the
  // scheduler's per-request table), which must outlive the forward call. The step data gets the
  // one copy of it.
  std::span<const int32_t> pages;
  // A filler row of a fixed-shape step (a CUDA graph's batch-size bucket, engine/decode_graphs.h):
  // one token at position 0 in the scratch slot and page (CacheStore::kScratchSlot/kScratchPage),
  // which no live sequence uses, so fillers may share them; their logits are ignored.
  bool padding = false;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // sum of seqs[i].num_tokens entries
  std::vector<SequenceInput> seqs;  // in token order
  CacheStore* store = nullptr;      // for store-backed sequences (ignored with private caches)
  // Compute every row the same way whatever else is in the batch and however the sequence was
  // split into steps (kernels/batch_invariance.h); slower. Set by the engine's --deterministic.
  bool batch_invariant = false;
  // Step memory for every intermediate (reset by Model::forward); null: the call allocates its
  // own. The serving engine passes one that lives as long as it does.
  Workspace* workspace = nullptr;
  // Where the step's integer inputs are packed (engine/model/step_data.h); null: the call packs
  // into its own.
  StepData* step = nullptr;
  // Width of the packed page table: at least this many columns (0: the longest sequence's
  // pages). A CUDA graph step fixes it, since the attention kernels' launch bounds follow it.
  int64_t page_cols = 0;
  // Routing replay (the trainer's forwards; host tensors on any device): the experts every MoE
  // layer routes the batch's rows to, rows in token order; validated by Model::forward
  // (validate_routing_replay), its counters added to. Null: each layer's own top-k (serving).
  RoutingReplay* routing_replay = nullptr;
  // The forward of a training step (Model::loss_and_gradients*): every sequence starts at position
  // 0 and nothing reads the step's caches afterwards, so attention layers compute as their
  // backward's recomputation does (the training attention kernels over the step's own keys and
  // values) and write no cache (ForwardContext::training).
  bool training = false;
};

}  // namespace loom
