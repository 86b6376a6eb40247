// Model::loss_and_gradients and its packed form: the sequences' forward over one varlen batch
// (with a tape of every sublayer's input and output), the fused cross-entropy, and the backward of
// every layer, last first (model_backward.cc).
#include <algorithm>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "kernels/activation.h"
#include "kernels/loss.h"

namespace loom {
namespace {

constexpr int64_t kIgnoreTarget = -100;

bool scores(const TrainingSequence& s, int64_t t) {
  return t + 1 < static_cast<int64_t>(s.tokens.size()) && (s.loss_mask.empty() || s.loss_mask[t]);
}

}  // namespace

absl::StatusOr<double> Model::loss_and_gradients(std::span<const int32_t> tokens, Gradients& grads,
                                                 std::span<const uint8_t> loss_mask,
                                                 std::vector<float>* row_loss,
                                                 std::span<const float> row_weights,
                                                 RoutingReplay* routing_replay) const {
  const TrainingSequence seq{tokens, loss_mask, row_weights};
  LOOM_ASSIGN_OR_RETURN(const std::vector<double> losses,
                        loss_and_gradients_packed({&seq, 1}, grads, row_loss, routing_replay));
  return losses[0];
}

absl::StatusOr<std::vector<double>> Model::loss_and_gradients_packed(
    std::span<const TrainingSequence> seqs, Gradients& grads, std::vector<float>* row_loss,
    RoutingReplay* routing_replay) const {
  if (seqs.empty()) return absl::InvalidArgumentError("training: a packed call of no sequences");
  const int64_t b = static_cast<int64_t>(seqs.size());
  // first[s]: sequence s's first row in the packed batch; scored[s]: its scored positions.
  std::vector<int64_t> first(b + 1, 0), scored(b, 0);
  int64_t longest = 0;
  for (int64_t s = 0; s < b; ++s) {
    const TrainingSequence& seq = seqs[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    const std::string which = b > 1 ? absl::StrCat("sequence ", s, ": ") : "";
    if (!seq.loss_mask.empty() && static_cast<int64_t>(seq.loss_mask.size()) != n)
      return absl::InvalidArgumentError(absl::StrCat("training: ", which, "a loss mask of ",
                                                     seq.loss_mask.size(), " entries for ", n,
                                                     " tokens"));
    if (!seq.row_weights.empty() && static_cast<int64_t>(seq.row_weights.size()) != n)
      return absl::InvalidArgumentError(absl::StrCat("training: ", which, seq.row_weights.size(),
                                                     " row weights for ", n, " tokens"));
    for (int64_t t = 0; t < n; ++t) scored[s] += scores(seq, t);
    if (scored[s] == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("training: ", which, "a sequence of ", n, " tokens has nothing to predict"));
    first[s + 1] = first[s] + n;
    longest = std::max(longest, n);
  }
  const int64_t n = first[b];
  const Device device = placement_.device;
  if (act_dtype_ != DType::kF32)
    return absl::InvalidArgumentError(
        "training: the backward computes in f32: load the model with f32 activations");
  if (!grads.set_device(device))
    return absl::InvalidArgumentError(absl::StrCat("training: gradients on ",
                                                   device_name(grads.device()), " for a model on ",
                                                   device_name(device)));
  std::unique_lock<std::mutex> memory_lock(training_mu_, std::try_to_lock);
  std::unique_ptr<TrainingMemory> own_memory;
  TrainingMemory* memory = nullptr;
  if (memory_lock.owns_lock()) {
    if (training_memory_ == nullptr) training_memory_ = std::make_unique<TrainingMemory>(device);
    memory = training_memory_.get();
  } else {
    own_memory = std::make_unique<TrainingMemory>(device);
    memory = own_memory.get();
  }

  // 1. The forward, keeping what the backward reads. One sequence runs on a private cache (the
  // call as it always was); several on the memory's store, sequence s in slot s and page s.
  ForwardBatch batch;
  batch.workspace = &memory->forward;
  batch.step = &memory->forward_step;
  batch.routing_replay = routing_replay;
  batch.training = true;
  batch.token_ids.reserve(n);
  for (const TrainingSequence& seq : seqs)
    batch.token_ids.insert(batch.token_ids.end(), seq.tokens.begin(), seq.tokens.end());
  std::optional<SequenceCache> cache;
  std::vector<int32_t> page_ids(b);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  if (b == 1) {
    cache.emplace(new_cache());
    batch.seqs.push_back({.num_tokens = n, .logits = LogitsMode::kNone, .cache = &*cache});
  } else {
    CacheStore* store = memory->store.get();
    if (store == nullptr || store->num_slots() < b || store->num_pages() < b ||
        store->page_size() < longest) {
      const CacheStore::Options options{
          .num_pages = std::max(b, store != nullptr ? store->num_pages() : 0),
          .page_size = std::max(longest, store != nullptr ? store->page_size() : 0),
          .num_slots = std::max(b, store != nullptr ? store->num_slots() : 0),
          .device = device,
          .act_dtype = act_dtype_};
      memory->store.reset();  // its memory goes before the larger store takes its own
      LOOM_ASSIGN_OR_RETURN(memory->store, CacheStore::create(cfg_, options));
      store = memory->store.get();
    } else {
      for (int64_t s = 0; s < b; ++s) store->reset_slot(s);
    }
    batch.store = store;
    for (int64_t s = 0; s < b; ++s)
      batch.seqs.push_back({.num_tokens = first[s + 1] - first[s],
                            .logits = LogitsMode::kNone,
                            .start = 0,
                            .slot = static_cast<int32_t>(s),
                            .pages = std::span<const int32_t>(&page_ids[s], 1)});
  }
  ActivationTape tape;
  memory->tape.reset();  // grows the block to the last call's high-water mark
  tape.keep_in(exec_for(device, &memory->tape), &memory->tape);
  LOOM_RETURN_IF_ERROR(forward(batch, &tape).status());

  // The backward's own step: the sequences' rows from position 0, its step data built on the
  // host and uploaded in one copy, the targets and row weights in two more, each into memory that
  // stays from step to step (no allocation, no synchronisation).
  Workspace& ws = memory->backward;
  ws.reset();  // grows the block to the last call's high-water mark
  Exec ex = exec_for(device, &ws);
  ex.matmul = matmul_;
  StepData& step = memory->backward_step;
  step.begin({.tokens = n, .seqs = b, .logit_rows = 0, .page_cols = 0});
  Tensor targets = Tensor::empty({n}, DType::kI64);
  // A mean over each of several sequences is a weighted sum with weight 1 / scored rows; one
  // sequence keeps the kernel's mean (the same bits as ever).
  const bool weighted = b > 1 || !seqs[0].row_weights.empty();
  Tensor weights = weighted ? Tensor::empty({n}) : Tensor();
  for (int64_t s = 0; s < b; ++s) {
    const TrainingSequence& seq = seqs[s];
    const float mean_weight = 1.0f / static_cast<float>(scored[s]);
    for (int64_t t = 0; t < first[s + 1] - first[s]; ++t) {
      const int64_t r = first[s] + t;
      step.token_ids.data<int32_t>()[r] = seq.tokens[t];
      targets.data<int64_t>()[r] = scores(seq, t) ? seq.tokens[t + 1] : kIgnoreTarget;
      step.positions.data<int64_t>()[r] = t;
      if (weighted)
        weights.data<float>()[r] = seq.row_weights.empty() ? mean_weight : seq.row_weights[t];
    }
    step.cu_seqlens.data<int64_t>()[s] = first[s];
    step.past_lens.data<int64_t>()[s] = 0;
    step.state_slots.data<int32_t>()[s] = static_cast<int32_t>(s);
  }
  step.cu_seqlens.data<int64_t>()[b] = n;
  step.publish(ex);
  auto upload = [&](const Tensor& host) {
    if (!host.defined() || device.is_cpu()) return host;
    Tensor on = ws.take(host.shape(), host.dtype());
    upload_async(ex, on.raw(), host.raw(), host.nbytes());
    return on;
  };
  const Tensor device_targets = upload(targets), device_weights = upload(weights);
  BatchLayout layout;
  layout.positions = step.on_device(step.positions);
  layout.cu_seqlens = step.on_device(step.cu_seqlens);
  layout.past_lens = step.on_device(step.past_lens);
  layout.host_cu_seqlens = step.cu_seqlens;  // so that no layer's backward reads them back
  layout.host_past_lens = step.past_lens;
  layout.state_slots = step.on_device(step.state_slots);
  layout.num_rows = n;
  layout.max_seqlen = longest;
  // The replay's counters count the forward's slots; the backward's recomputation skips them.
  const ForwardContext ctx{ex,   layout, act_dtype_, nullptr, routing_replay, /*training=*/true,
                           &tape};

  // 2. The loss over each sequence's positions but its last (each predicts the next token) and
  // its gradient.
  const int64_t d = cfg_.hidden_size;
  Tensor loss = ws.take({1});
  Tensor d_normed = ctx.take({n, d});
  // Several sequences' objectives come from the row losses.
  Tensor rows = row_loss != nullptr || b > 1 ? ws.take({n}) : Tensor();
  const Tensor* final_normed = tape.find(-1, "final_normed");
  LOOM_CHECK(final_normed != nullptr, "training: the forward recorded no final_normed");
  cross_entropy_forward_backward(
      ex, *final_normed, lm_head_, device_targets, kIgnoreTarget, 1.0f, loss, rows, d_normed,
      grads.get("lm_head.weight", lm_head_.shape()), device_weights, targets);
  // 3. The layers, last first.
  Tensor d_embedding = ctx.take({n, d});
  LOOM_RETURN_IF_ERROR(cfg_.attnres_block_size > 0
                           ? backward_block_attnres(ctx, tape, d_normed, d_embedding, grads)
                           : backward_plain_residual(ctx, tape, d_normed, d_embedding, grads));
  // The host's ids: the kernel sorts them on the host, and need not read them back.
  embedding_backward(ex, step.token_ids, d_embedding, grads.get("embed.weight", embed_.shape()));

  // The step's one read back: the loss, or the row losses it is made of.
  std::vector<double> out(b, 0.0);
  if (!rows.defined()) {
    float value = 0.0f;
    download(ex, &value, loss.raw(), sizeof(value));
    out[0] = static_cast<double>(value);
    return out;
  }
  std::vector<float> host_rows(static_cast<size_t>(n));
  download(ex, host_rows.data(), rows.raw(), rows.nbytes());
  if (b == 1) {
    float value = 0.0f;  // after the rows' download: no second wait
    download(ex, &value, loss.raw(), sizeof(value));
    out[0] = static_cast<double>(value);
  }
  const float* r = host_rows.data();
  if (row_loss != nullptr) row_loss->assign(r, r + n);
  if (b == 1) return out;
  for (int64_t s = 0; s < b; ++s) {
    const TrainingSequence& seq = seqs[s];
    double sum = 0;  // in row order, as the kernel sums
    for (int64_t t = 0; t < first[s + 1] - first[s]; ++t) {
      if (!scores(seq, t)) continue;
      sum += seq.row_weights.empty() ? double{r[first[s] + t]}
                                     : double{seq.row_weights[t]} * r[first[s] + t];
    }
    out[s] = seq.row_weights.empty() ? sum / static_cast<double>(scored[s]) : sum;
  }
  return out;
}

}  // namespace loom
