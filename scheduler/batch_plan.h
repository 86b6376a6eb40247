// What the scheduler tells the engine to run in one step, and what the engine reports back.
// Written by Scheduler::schedule() (BatchPlan) and by the engine (StepResult); plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace loom {

// One sequence of one step. Positions [start_pos, start_pos + tokens.size()) are computed.
struct SeqPlan {
  uint64_t request_id = 0;
  // Linear-attention state slot owned by this request for its whole (current) life; -1 when the
  // model has no linear layers. Never StateSlotPool::kScratchSlot.
  int32_t state_slot = -1;
  // Page ids covering positions [0, start_pos + tokens.size()), page i holds positions
  // [i * page_size, (i + 1) * page_size). Empty when the model has no attention layers. Leading
  // pages may be shared (prefix cache); pages this step writes are owned by this request alone;
  // never KvPagePool::kScratchPage. A view of the request's own table, which the scheduler keeps
  // and appends to as the sequence grows (nothing is copied per step): valid until complete() of
  // this plan, even for a request cancelled meanwhile.
  std::span<const int32_t> page_table;
  int32_t start_pos = 0;        // tokens already in the cache for this request
  std::vector<int32_t> tokens;  // token ids to feed, at positions start_pos...
  bool is_decode = false;       // one token after a completed prefill
  // This step ends the known tokens: the engine samples one token from the last position and
  // reports it in StepResult. False for a prefill chunk that stops short.
  bool sample = false;
  // start_pos == 0 without a restore: reset the state slot (and conv tail) before running.
  bool fresh_state = false;
  // Prefix-cache hit (first chunk only): copy this checkpoint slot into state_slot before running;
  // it holds the state at exactly start_pos. -1 otherwise.
  int32_t restore_from_slot = -1;
  // After running, copy state_slot into this checkpoint slot; it then holds the state at
  // start_pos + tokens.size() (a chunk ends at every checkpoint position). -1: no save.
  int32_t save_to_slot = -1;
  // Prompt tokens reused from the prefix cache, on the first chunk after (re)admission (usage's
  // cached_tokens); 0 otherwise.
  int32_t prefix_hit_tokens = 0;
  // Output tokens this request already produced (and the engine already streamed), counting those
  // from before a preemption. The next sampled token is output number num_output_tokens + 1.
  int32_t num_output_tokens = 0;
};

struct BatchPlan {
  uint64_t step = 0;          // increasing step number
  std::vector<SeqPlan> seqs;  // decodes first, then prefill chunks
  int32_t num_batched_tokens = 0;
  // Requests preempted (recompute) while building this plan: their pages and slot are gone; the
  // engine keeps their streams and already produced tokens, and they come back later as a prefill
  // of prompt + produced tokens (start_pos 0 or a prefix hit) and then continue generating.
  std::vector<uint64_t> preempted;
};

// The engine's report of one scheduled sequence.
struct SeqResult {
  uint64_t request_id = 0;
  std::optional<int32_t> token;  // present iff the plan entry had sample == true
  // The engine ends the sequence now (a stop token or string, a failed step). Why is the engine's
  // business: the scheduler only frees what the sequence holds.
  bool finished = false;
};

struct StepResult {
  std::vector<SeqResult> seqs;  // one per SeqPlan of the last plan (cancelled ones may be omitted)
};

// Why complete() ended a request. Reaching max_new_tokens is the only end the scheduler decides
// itself; every other one the engine reported through SeqResult::finished and knows the reason of.
enum class SchedFinish { kByEngine, kLength };

struct FinishedRequest {
  uint64_t request_id = 0;
  SchedFinish cause = SchedFinish::kByEngine;
  int32_t num_output_tokens = 0;
  // A session turn (SchedRequest::park_key): every token of the sequence (prompt + outputs, the
  // last output not computed), and whether its pages and slot were parked (false: over budget).
  std::vector<int32_t> tokens;
  bool parked = false;
};

}  // namespace loom
