// Batch-invariant numerics: the engine's --deterministic mode.
//
// In this mode every kernel computes each output row by the same sequence of floating-point
// operations whatever the number of rows in the call and the row's place among them, so a
// request's logits are bit-identical alone or in a batch of 64, split into any prefill chunks,
// restored from the prefix cache or recomputed after preemption. What it changes (cost measured
// in docs/operations.md):
//   - GEMMs (CPU): Loom's own row-invariant kernel for every row count (OpenBLAS's blocking, and
//     its GEMV for one row, depend on the row count);
//   - linear attention (KDA/GDN): the token recurrence for every length (the chunked form's
//     rounding depends on where chunks start);
//   - MLA: the absorbed form for prefill as for decode (the expanded form rounds differently).
// Everything else (norms, softmax rows, RoPE, MoE combine in top-k order, sampling per request)
// is batch-invariant in both modes.
//
// The mode is a property of the calling thread for the duration of a model forward (set by
// Model::forward from ForwardBatch::batch_invariant); kernels read it when they choose an
// algorithm, never inside OpenMP regions. It moves into the execution context with issue 12.
#pragma once

namespace loom {

// True inside a ScopedBatchInvariance(true) on this thread.
bool batch_invariant_numerics();

// Sets the calling thread's mode until destruction (restores the previous one). Not copyable.
class ScopedBatchInvariance {
 public:
  explicit ScopedBatchInvariance(bool on);
  ~ScopedBatchInvariance();
  ScopedBatchInvariance(const ScopedBatchInvariance&) = delete;
  ScopedBatchInvariance& operator=(const ScopedBatchInvariance&) = delete;

 private:
  bool previous_;
};

}  // namespace loom
