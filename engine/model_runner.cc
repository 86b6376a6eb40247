#include "engine/model_runner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "scheduler/id_pool.h"

namespace loom {

// The store's padding target is the page and slot the scheduler never hands out.
static_assert(CacheStore::kScratchPage == KvPagePool::kScratchPage);
static_assert(CacheStore::kScratchSlot == StateSlotPool::kScratchSlot);

ModelRunner::ModelRunner(const Model& model, CacheStore& store, bool batch_invariant,
                         size_t workspace_bytes)
    : model_(model),
      store_(store),
      batch_invariant_(batch_invariant),
      workspace_(model.device(), workspace_bytes),
      step_(model.device()) {
  LOOM_CHECK(store.device() == model.device(),
             "ModelRunner: the cache store is on %s, the model on %s",
             device_name(store.device()).c_str(), device_name(model.device()).c_str());
}

absl::StatusOr<GraphCaptureReport> ModelRunner::enable_decode_graphs(const StepShape& largest) {
  if (!graphs_supported(model_.device()))
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA graphs need a CUDA device; the model is on ", device_name(model_.device())));
  // A decode step holds one token per sequence: the token budget bounds its sequences too.
  const int64_t seqs = std::min({largest.seqs, largest.tokens, largest.logit_rows});
  graphs_ = std::make_unique<DecodeGraphs>(model_, store_, workspace_, step_, batch_invariant_,
                                           static_cast<int32_t>(seqs), largest.page_cols);
  absl::StatusOr<GraphCaptureReport> report = graphs_->capture_all();
  if (!report.ok()) graphs_.reset();
  return report;
}

void ModelRunner::set_step_clock(DeviceStepClock* clock) {
  clock_ = clock;
  if (clock == nullptr) {
    step_.set_before_publish(nullptr);
  } else {
    step_.set_before_publish([clock](const Exec& ex) { clock->mark_start(ex); });
  }
}

ForwardBatch& ModelRunner::next_batch() {
  ForwardBatch& batch = batch_;
  batch.store = &store_;
  batch.batch_invariant = batch_invariant_;
  batch.workspace = &workspace_;
  batch.step = &step_;
  batch.page_cols = 0;
  return batch;
}

absl::StatusOr<Tensor> ModelRunner::run(const BatchPlan& plan, ActivationTape* tape) {
  ForwardBatch& batch = next_batch();
  batch.token_ids.clear();
  batch.seqs.resize(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqPlan& s = plan.seqs[i];
    if (store_.has_linear()) {
      if (clock_ != nullptr && (s.restore_from_slot >= 0 || s.fresh_state))
        clock_->mark_start(exec_for(model_.device()));
      if (s.restore_from_slot >= 0) {
        store_.copy_slot(s.restore_from_slot, s.state_slot);
      } else if (s.fresh_state) {
        store_.reset_slot(s.state_slot);
      }
    }
    batch.token_ids.insert(batch.token_ids.end(), s.tokens.begin(), s.tokens.end());
    SequenceInput& in = batch.seqs[i];
    in.num_tokens = static_cast<int64_t>(s.tokens.size());
    in.logits = s.sample ? LogitsMode::kLast : LogitsMode::kNone;
    in.cache = nullptr;
    in.start = s.start_pos;
    in.slot = s.state_slot;
    in.pages = s.page_table;  // a view: make_layout packs the one copy
    in.padding = false;
  }
  LOOM_ASSIGN_OR_RETURN(Tensor logits,
                        tape == nullptr && graphs_ != nullptr && graphs_->accepts(batch)
                            ? graphs_->run(batch)
                            : model_.forward(batch, tape));
  if (store_.has_linear()) {
    for (const SeqPlan& s : plan.seqs)
      if (s.save_to_slot >= 0) store_.copy_slot(s.state_slot, s.save_to_slot);
  }
  return logits;
}

absl::Status ModelRunner::run_dummy() {
  static constexpr int32_t kScratchTable[1] = {CacheStore::kScratchPage};
  ForwardBatch& batch = next_batch();
  batch.token_ids.assign(1, 0);
  batch.seqs.resize(1);
  SequenceInput& in = batch.seqs[0];
  in = SequenceInput{};
  in.num_tokens = 1;
  in.logits = LogitsMode::kNone;
  in.slot = CacheStore::kScratchSlot;
  in.pages = kScratchTable;
  in.padding = true;
  if (store_.has_linear()) {
    if (clock_ != nullptr) clock_->mark_start(exec_for(model_.device()));
    store_.reset_slot(CacheStore::kScratchSlot);
  }
  return model_.forward(batch).status();
}

}  // namespace loom
