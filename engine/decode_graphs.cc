#include "engine/decode_graphs.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace loom {
namespace {

// The page table of a padding row: the scratch page only (the step data pads the rest with it).
constexpr int32_t kScratchTable[1] = {CacheStore::kScratchPage};

SequenceInput filler_row() {
  SequenceInput in;
  in.num_tokens = 1;
  in.logits = LogitsMode::kLast;
  in.start = 0;
  in.slot = CacheStore::kScratchSlot;
  in.pages = kScratchTable;
  in.padding = true;
  return in;
}

}  // namespace

std::vector<int32_t> decode_buckets(int32_t max_seqs) {
  std::vector<int32_t> out;
  for (int32_t b : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64})
    if (b < max_seqs) out.push_back(b);
  for (int32_t b = 96; b < max_seqs; b += 32) out.push_back(b);
  if (max_seqs > 0) out.push_back(max_seqs);
  return out;
}

int32_t bucket_for(std::span<const int32_t> buckets, int64_t seqs) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), seqs);
  return it == buckets.end() ? 0 : *it;
}

int64_t graph_page_cols(int64_t pages, int64_t max_cols) {
  if (pages > max_cols) return 0;
  int64_t cols = kMinGraphPageCols;
  while (cols < pages) cols *= 2;
  return std::min(cols, max_cols);
}

std::string GraphCaptureReport::describe() const {
  return absl::StrCat("CUDA graphs: ", buckets.size(), " decode batch sizes (",
                      absl::StrJoin(buckets, ","), ") at ", page_cols, " page columns, ", nodes,
                      " nodes (", programmatic_edges, " programmatic edges), recorded in ",
                      absl::StrFormat("%.2f", seconds), " s, ",
                      absl::StrFormat("%.1f", device_bytes / 1048576.0), " MiB of device memory");
}

DecodeGraphs::DecodeGraphs(const Model& model, CacheStore& store, Workspace& workspace,
                           StepData& step, bool batch_invariant, int32_t max_seqs,
                           int64_t max_page_cols)
    : model_(model),
      store_(store),
      workspace_(workspace),
      step_(step),
      batch_invariant_(batch_invariant),
      max_page_cols_(store.has_attention() ? max_page_cols : 0),
      buckets_(decode_buckets(max_seqs)) {
  filler_.store = &store_;
  filler_.batch_invariant = batch_invariant_;
  filler_.workspace = &workspace_;
  filler_.step = &step_;
}

absl::StatusOr<GraphCaptureReport> DecodeGraphs::capture_all() {
  GraphCaptureReport report;
  report.page_cols = store_.has_attention() ? graph_page_cols(1, max_page_cols_) : 0;
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<DeviceMemory> before = device_memory(model_.device());
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
    LOOM_ASSIGN_OR_RETURN(const Graph* g, record({*it, report.page_cols}));
    (void)g;
  }
  for (const auto& [key, g] : graphs_) {
    report.buckets.push_back(key.first);
    report.nodes += static_cast<int64_t>(g.graph.nodes());
    report.programmatic_edges += static_cast<int64_t>(g.graph.programmatic_edges());
  }
  const absl::StatusOr<DeviceMemory> after = device_memory(model_.device());
  if (before.ok() && after.ok())
    report.device_bytes =
        static_cast<int64_t>(before->free_bytes) - static_cast<int64_t>(after->free_bytes);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

int64_t DecodeGraphs::pages_needed(const ForwardBatch& batch) const {
  if (!store_.has_attention()) return 0;
  const int64_t ps = store_.page_size();
  int64_t pages = 0;
  for (const SequenceInput& in : batch.seqs)
    pages = std::max(pages, (in.start + in.num_tokens + ps - 1) / ps);
  return pages;
}

bool DecodeGraphs::accepts(const ForwardBatch& batch) const {
  if (batch.seqs.empty() || batch.page_cols != 0 ||
      bucket_for(buckets_, static_cast<int64_t>(batch.seqs.size())) == 0)
    return false;
  for (const SequenceInput& in : batch.seqs)
    if (in.num_tokens != 1 || in.logits != LogitsMode::kLast || in.cache != nullptr || in.padding)
      return false;
  return !store_.has_attention() || graph_page_cols(pages_needed(batch), max_page_cols_) > 0;
}

void DecodeGraphs::pad(ForwardBatch& batch, int32_t bucket, int64_t cols) const {
  batch.page_cols = cols;
  // Any valid id: 0 is in every vocabulary.
  batch.token_ids.resize(static_cast<size_t>(bucket), 0);
  batch.seqs.resize(static_cast<size_t>(bucket), filler_row());
}

void DecodeGraphs::drop_if_moved() {
  if (workspace_.capacity() == workspace_capacity_ && step_.capacity_bytes() == step_capacity_)
    return;
  graphs_.clear();
  workspace_capacity_ = workspace_.capacity();
  step_capacity_ = step_.capacity_bytes();
}

absl::StatusOr<const DecodeGraphs::Graph*> DecodeGraphs::record(const Key& key) {
  const auto [bucket, cols] = key;
  filler_.token_ids.clear();
  filler_.seqs.clear();
  pad(filler_, bucket, cols);
  // The same shape eagerly first: it raises the workspace's high-water mark to this step's and
  // runs every kernel's one-time set-up, neither of which a recording may do.
  LOOM_RETURN_IF_ERROR(model_.forward(filler_).status());
  workspace_.reset();  // grows the block now, if it must, outside the recording
  drop_if_moved();
  LOOM_ASSIGN_OR_RETURN(const BatchLayout layout, model_.prepare(filler_));
  const uint64_t overflows = workspace_.overflow_allocations();
  Graph g;
  const Exec ex = exec_for(model_.device(), &workspace_);
  LOOM_ASSIGN_OR_RETURN(g.graph, capture_graph(ex, [&] {
                          // Padding rows start from a clean state: whatever an earlier step left
                          // in the scratch slot or page (even NaN) never reaches them.
                          if (store_.has_linear()) store_.reset_slot(CacheStore::kScratchSlot);
                          if (store_.has_attention()) store_.reset_page(CacheStore::kScratchPage);
                          g.logits = model_.launch(filler_, layout);
                        }));
  LOOM_CHECK(workspace_.overflow_allocations() == overflows,
             "DecodeGraphs: the workspace grew while recording batch %d (the eager run of the "
             "same shape should have sized it)",
             bucket);
  ++captures_;
  return &(graphs_[key] = std::move(g));
}

absl::StatusOr<Tensor> DecodeGraphs::run(ForwardBatch& batch) {
  const int64_t seqs = static_cast<int64_t>(batch.seqs.size());
  const Key key{bucket_for(buckets_, seqs),
                store_.has_attention() ? graph_page_cols(pages_needed(batch), max_page_cols_) : 0};
  // A larger eager step may have raised the workspace's high-water mark: the block grows here,
  // between steps, and the graphs recorded against the old one go.
  workspace_.reset();
  drop_if_moved();
  const Graph* g = nullptr;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    g = &it->second;
  } else {
    LOOM_ASSIGN_OR_RETURN(g, record(key));
  }
  pad(batch, key.first, key.second);
  LOOM_RETURN_IF_ERROR(model_.prepare(batch).status());  // the step data's one upload
  g->graph.replay(exec_for(model_.device(), &workspace_));
  ++replays_;
  return g->logits.slice(0, 0, seqs);
}

}  // namespace loom
