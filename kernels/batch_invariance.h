// Batch-invariant numerics: the engine's --deterministic mode.
//
// In this mode every kernel computes each output row by the same sequence of floating-point
// operations whatever the number of rows in the call and the row's place among them, so a
// request's logits are bit-identical alone or in a batch of 64, split into any prefill chunks,
// restored from the prefix cache or recomputed after preemption. What it changes (cost measured
// in docs/operations.md):
//   - GEMMs: Loom's own row-invariant kernels for every row count (OpenBLAS's blocking and its
//     GEMV for one row, cuBLAS's algorithm and split-K choices, depend on the row count); on
//     CUDA a fixed-k-order kernel (kernels/cuda/gemm_invariant.cu, gemm_bf16.cu);
//   - linear attention (KDA/GDN): the token recurrence for every length (the chunked form's
//     rounding depends on where chunks start);
//   - MLA: the absorbed form for prefill as for decode (the expanded form rounds differently).
// Everything else (norms, softmax rows, RoPE, MoE combine in top-k order, sampling per request)
// is batch-invariant in both modes.
//
// The mode is a field of the execution context (Exec::batch_invariant, set from
// ForwardBatch::batch_invariant). The CPU backend's GEMM reads it through cpu::RowInvariantScope,
// which the dispatchers of the ops that multiply matrices open for the duration of the CPU call.
#pragma once
