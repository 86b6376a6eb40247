// A KDA or Gated DeltaNet layer's decode step from its projections to its gated output norm, as one
// op: on CUDA one kernel where three ran (kernels/cuda/kda_decode_step.cu), since at batch 1 each
// of them is a latency-bound launch on the step's critical path.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// The inputs of one decode step of B sequences of one new token each (row b is sequence b).
struct KdaDecodeStep {
  // kda_decode_prepare's (kernels/kda.h, its contract): qkv [B, 2 Hk dk + Hv dv], conv_weight
  // [C, W] f32, conv_states [num_slots, W-1, C], state_slots i32 [B], f [B, Hv dk] (KDA) or
  // [B, Hv] (GDN), A_log [Hv], dt_bias f's width or undefined, lower_bound, qk_eps.
  Tensor qkv, conv_weight, conv_states, state_slots, f, A_log, dt_bias;
  float lower_bound = 0.0f, qk_eps = 1e-6f;
  // [B, Hv], the raw projection. Its contents after the call are unspecified (the composition
  // applies sigmoid in place, the fused kernel reads it only).
  Tensor beta;
  // i64 [B + 1] = 0, 1, ..., B on the device of the others (the composition's recurrence reads
  // it; the fused kernel does not).
  Tensor cu_seqlens;
  Tensor states;       // the recurrent states [num_slots, Hv, dk, dv] f32, updated in place
  float scale = 1.0f;  // q's scale in the recurrence (1 / sqrt(dk) in the models)
  Tensor norm_weight;  // [dv] f32: the per-head output RMSNorm's
  float norm_eps = 1e-6f;
  Tensor gate;             // B Hv dv elements of the activation dtype: element i gates out's i
  bool gate_silu = false;  // out = norm * silu(gate) (GDN); else norm * sigmoid(gate) (KDA)
};

// out [B, Hv, dv] (contiguous, qkv's dtype) = the composition, with its bits:
//   kda_decode_prepare(qkv, ..., beta, q, k, v, g);
//   kda_varlen_forward(q, k, v, g, beta, scale, states, state_slots, cu_seqlens, out, 1);
//   KDA: rmsnorm_gated_forward(out rows, norm_weight, norm_eps, gate, out rows);
//   GDN: rmsnorm_forward(out rows, norm_weight, norm_eps, 0, out rows), mul_silu_inplace(.., gate).
// Slots as kda_decode_prepare takes them (the CPU's recurrence takes none outside the pool). The
// composition's scratch (q, k, v, g) comes from ex.workspace, or fresh tensors without one.
void kda_decode_step(const Exec& ex, const KdaDecodeStep& s, const Tensor& out);

// True when kda_decode_step(ex, s, out) runs as the one fused kernel: CUDA outside batch-invariant
// mode (whose recurrence is another kernel), at most one wave of its blocks (B x Hk <= two an SM:
// past that the separate kernels are faster), qkv, conv_states, gate and out of one dtype, dv a
// multiple of 4, dk <= 256, 16-byte aligned states and out, a head's state within a block's
// shared memory, and LOOM_KDA_FUSED_DECODE not "0" (the A/B switch). False on the host.
bool kda_decode_step_is_fused(const Exec& ex, const KdaDecodeStep& s, const Tensor& out);

}  // namespace loom
