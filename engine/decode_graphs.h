// DecodeGraphs: decode steps replayed as CUDA graphs. A decode step of a large model is a few
// hundred small kernels; launched one by one from the host they cost more than the device's work
// at small batches (about 7 ms a step for a 27-layer model at batch 1, against a ~1.5 ms
// roofline). Here each step is one graph launch.
//
// A graph replays the kernels it recorded with the same grids and the same addresses, so a step
// runs in a fixed shape: its B sequences are padded to the smallest bucket of a ladder of batch
// sizes, and its page table to a fixed width (a power of two of pages, kMinGraphPageCols at
// least). Padding rows are one valid token at position 0 in the scratch slot and page
// (CacheStore::kScratchSlot/kScratchPage: never handed to a request); every graph starts by
// zeroing the scratch slot's state and the scratch page, so a padding row computes from a clean
// state whatever was left there (NaN included) and cannot put a non-finite value into any shared
// op (an expert's rows, a router). Their logits
// are dropped. What the graph reads lives at fixed addresses: the step data's device block (packed
// and uploaded before each replay, in the same layout for the same shape), the workspace (a graph
// is recorded against one block: when a larger step grows the workspace, every graph is dropped
// and recorded again when next needed) and the logits view inside it.
//
// Recording runs the same shape once eagerly first, so the workspace is sized and every kernel's
// one-time set-up (cuBLASLt plans, shared-memory limits) is done outside the recording.
// Prefill and mixed steps, and decode steps past the largest bucket or the widest table, run
// eagerly. Sampling stays outside the graph (it follows on the device's stream).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "engine/model/cache_store.h"
#include "engine/model/model.h"
#include "engine/model/step_data.h"
#include "kernels/graph.h"

namespace loom {

// The narrowest page table a graph is recorded with: 16 pages (1024 positions at the engine's
// 64-token pages) is the width recorded at start-up.
inline constexpr int64_t kMinGraphPageCols = 16;

// The batch sizes graphs are recorded for, ascending, up to `max_seqs` (which is always the last):
// every size to 8, then 12, 16, 24, 32, 48, 64, then steps of 32. Why this ladder: padding rows all
// feed one token from a zeroed state, so they route to one set of experts, and a padded step reads
// at most top-k more experts per MoE layer than its own rows; that is a third more at 3 rows but
// under a tenth past 16, where steps of 8 to 32 rows keep the padded rows a small share of a step
// that costs about the same either way. Graphs are small (kernel nodes only), so 20-odd are cheap.
std::vector<int32_t> decode_buckets(int32_t max_seqs);
// The smallest bucket holding `seqs` sequences; 0 when none does.
int32_t bucket_for(std::span<const int32_t> buckets, int64_t seqs);
// The page-table width of a graph step whose longest sequence needs `pages` pages: the smallest
// power of two >= max(pages, kMinGraphPageCols), capped at `max_cols`; 0 when `pages` > max_cols
// (no graph: the step runs eagerly).
int64_t graph_page_cols(int64_t pages, int64_t max_cols);

// What a round of recording did (the start-up log: EngineLoop::create).
struct GraphCaptureReport {
  std::vector<int32_t> buckets;    // batch sizes recorded
  int64_t page_cols = 0;           // at this page-table width
  int64_t nodes = 0;               // kernel, copy and memset nodes over all graphs
  int64_t programmatic_edges = 0;  // PDL edges over all graphs (kernels/graph.h)
  double seconds = 0;              // eager warm-ups, recording and instantiation
  int64_t device_bytes = 0;        // device memory the graphs took (free memory before - after)
  std::string describe() const;
};

class DecodeGraphs {
 public:
  // `max_seqs`: the most sequences a step can hold (the largest bucket); `max_page_cols`: the
  // widest page table the step data was reserved for. The store, workspace and step data are the
  // runner's and must outlive this.
  DecodeGraphs(const Model& model, CacheStore& store, Workspace& workspace, StepData& step,
               bool batch_invariant, int32_t max_seqs, int64_t max_page_cols);

  // Records every bucket at the narrowest width, largest first (so the workspace grows once).
  absl::StatusOr<GraphCaptureReport> capture_all();

  // Whether `batch` (the runner's, filled for the step) can run as a graph: a decode step (every
  // sequence one new token wanting its logits, store-backed) of at most the largest bucket, whose
  // longest page table fits the widest width.
  bool accepts(const ForwardBatch& batch) const;
  // Runs an accepted batch: pads it to its bucket, uploads its step data and replays the bucket's
  // graph (recording it first when that bucket and width are new or the workspace moved). Returns
  // logits [B, V] of the batch's own sequences: a view into the workspace, valid until the next
  // step. `batch` keeps the padding rows afterwards.
  absl::StatusOr<Tensor> run(ForwardBatch& batch);

  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }
  const std::vector<int32_t>& buckets() const { return buckets_; }

 private:
  struct Graph {
    DeviceGraph graph;
    Tensor logits;  // [bucket, V] in the workspace: what every replay writes
  };
  using Key = std::pair<int32_t, int64_t>;  // bucket, page-table width

  // The padding rows that fill `batch` up to `bucket` sequences at page width `cols`.
  void pad(ForwardBatch& batch, int32_t bucket, int64_t cols) const;
  // Drops every graph when the workspace or the step data's device block moved.
  void drop_if_moved();
  absl::StatusOr<const Graph*> record(const Key& key);
  int64_t pages_needed(const ForwardBatch& batch) const;

  const Model& model_;
  CacheStore& store_;
  Workspace& workspace_;
  StepData& step_;
  const bool batch_invariant_;
  const int64_t max_page_cols_;
  const std::vector<int32_t> buckets_;
  std::map<Key, Graph> graphs_;
  // The blocks the graphs were recorded against (a capacity changes only with a new block).
  size_t workspace_capacity_ = 0;
  size_t step_capacity_ = 0;
  ForwardBatch filler_;  // the all-padding batch a recording runs
  int64_t replays_ = 0, captures_ = 0;
};

}  // namespace loom
