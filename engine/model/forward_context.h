// ForwardContext: what every layer's forward receives for one step (where it runs, the step's
// sequences and caches, the workspace, the activation dtype and an optional activation tape).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "core/workspace.h"
#include "engine/model/activation_tape.h"
#include "engine/model/cache_store.h"
#include "engine/model/routing_replay.h"
#include "kernels/elementwise.h"
#include "kernels/exec.h"

namespace loom {

// Where each sequence's rows sit in the flattened batch and where its caches live: a state slot and
// a page-table row of `store` (private caches are staged into a store too: Model::forward). Every
// tensor is the kernels' view of the step's StepData (on the step's device): sequence-ordered work
// (convolution, recurrence, attention, cache writes) is one varlen kernel call per layer.
struct BatchLayout {
  Tensor token_ids;    // i32 [N] token id of every row
  Tensor positions;    // i64 [N] absolute position of every row
  Tensor logit_rows;   // i64 [R] rows whose logits are computed
  Tensor cu_seqlens;   // i64 [B + 1] first row of each sequence, then N
  Tensor past_lens;    // i64 [B] positions each sequence had cached before this step
  Tensor state_slots;  // i32 [B] linear-attention state slot of each sequence
  Tensor page_table;   // i32 [B, P] attention pages of each sequence
  int64_t num_rows = 0;
  int64_t max_seqlen = 0;       // the longest sequence's new rows (host-known: picks kernels)
  CacheStore* store = nullptr;  // never null in a forward
  // Host copies of cu_seqlens and past_lens where whoever built the layout has them (the model's
  // step packing, the training backward's own layout): kernels choose their form by them (MLA's
  // expanded prefill on a GPU); undefined: training_sequences reads them back from the device.
  Tensor host_cu_seqlens, host_past_lens;
};

// What every layer's forward receives for one step: where it runs (device, stream, numerics)
// with the step's workspace, and the step's sequences and caches. Layers take every
// intermediate from the workspace inside a Workspace::Mark, so a layer reuses the memory of the
// layer before and the step allocates nothing once the workspace is sized.
struct ForwardContext {
  Exec ex;  // ex.workspace is never null here
  const BatchLayout& batch;
  // The dtype of the activations passed between layers and ops (f32 on the CPU backend).
  DType act_dtype = DType::kF32;
  // Where layers keep what a backward pass (or a diagnostic) needs; null: keep nothing.
  ActivationTape* tape = nullptr;
  // The experts MoE layers route the batch's rows to instead of their own choice, with the
  // counters they add to; null: every layer routes by its own top-k (routing_replay.h).
  RoutingReplay* routing_replay = nullptr;
  // A training step's forward or backward (ForwardBatch::training): every sequence from position
  // 0, no cache read after the step. Attention mixers then run the training kernels and skip
  // their cache writes.
  bool training = false;
  // A training step's backward: the tape its forward filled, read-only (attention mixers take
  // their outputs and log-sum-exps from it instead of running the attention forward again).
  const ActivationTape* kept = nullptr;

  Workspace& ws() const { return *ex.workspace; }
  // Step memory for an intermediate: of the activation dtype, or of `dtype` where the op needs
  // its own (f32 gates and states whatever the activations are).
  Tensor take(Shape shape) const { return ex.workspace->take(shape, act_dtype); }
  Tensor take(Shape shape, DType dtype) const { return ex.workspace->take(shape, dtype); }
  // Records `value` on the tape, if there is one and it wants `name` (activation_tape.h), in
  // f32 whatever the activations are: readers compare taped values with f32 references.
  void record(int layer, std::string_view name, const Tensor& value) const {
    if (tape == nullptr || !tape->wants(name)) return;
    if (value.dtype() == DType::kF32) return tape->record(layer, name, value);
    const Tensor wide = Tensor::empty(value.shape(), DType::kF32, ex.device);
    const int64_t cols = value.ndim() > 0 ? value.dim(-1) : 1;
    const int64_t rows = cols > 0 ? value.numel() / cols : 0;
    copy_columns(ex, value.reshape({rows, cols}), 0, wide.reshape({rows, cols}));
    tape->record(layer, name, wide);
  }
};

}  // namespace loom
