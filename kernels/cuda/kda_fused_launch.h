// Raw launchers of the fused kernels around the KDA / Gated DeltaNet recurrence
// (kernels/cuda/kda_decode_prep.cu, kernels/cuda/kda_gated_norm.cu). Like launch.h this header
// includes no Loom or Abseil header, so nvcc never parses Abseil; the Tensor-level entry points and
// their checks are in kernels/cuda/kda_fused.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// How kernels/cuda/norm.cu reduces a row of d elements, which fused kernels reproduce to give its
// bits: `vec` elements a unit (1, or its 16-byte width when d and the pointers allow), and the
// threads that share a row (32: norm_warp_kernel, for rows of at most 64 units; else the block
// of norm_kernel, 64, 128 or 256 threads by d). Mirrors launch_norm there; the GPU test
// (tests/gpu/kda_fused_cuda_test.cc) compares bits, so a change on one side shows.
struct NormOrder {
  int vec = 1;
  int threads = 32;
};
inline NormOrder norm_order(int64_t d, bool vec_ok, int vec_width) {
  NormOrder o;
  o.vec = vec_ok && d % vec_width == 0 ? vec_width : 1;
  const int64_t units = d / o.vec;
  o.threads = units <= 64 ? 32 : (d >= 2048 ? 256 : (d >= 512 ? 128 : 64));
  return o;
}

// kda_decode_prepare for B rows of one token (row b is sequence b), one launch:
//   qkv [B, C = 2 ck + cv] (act), conv_w [C, W] f32, conv_pool [num_slots, W-1, C] (pool_bf16),
//   slots i32 [B]; q, k [B, Hk, dk] and v [B, Hv, dv] (act); f [B, gate_width] (f_bf16),
//   A_log [Hv] f32, dt_bias [gate_width] f32 or null, g [B, gate_width] f32 (gate_width Hv * dk,
//   or Hv for one decay per head); beta [B, Hv] (beta_bf16), sigmoid in place.
// act is bf16 when act_bf16, else f32. q_order / k_order: the l2 norm's reduction of a q / k head
// (norm_order of dk with q's / k's alignment), threads <= 64. dk <= 256.
struct KdaDecodePrepArgs {
  const void* qkv = nullptr;
  const float* conv_w = nullptr;
  void* conv_pool = nullptr;
  const int32_t* slots = nullptr;
  const void* f = nullptr;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  void* beta = nullptr;
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  float* g = nullptr;
  float lower_bound = 0.0f, qk_eps = 0.0f, qk_scale = 1.0f;
  int64_t B = 0, num_slots = 0, gate_width = 0;
  int Hk = 0, Hv = 0, dk = 0, dv = 0, W = 0;
  NormOrder q_order, k_order;
  bool act_bf16 = false, pool_bf16 = false, f_bf16 = false, beta_bf16 = false;
};
inline constexpr int kKdaDecodePrepMaxDk = 256;
void kda_decode_prepare(cudaStream_t stream, const KdaDecodePrepArgs& a);

// kda_decode_step (kernels/cuda/kda_decode_step.cu) for B rows of one token, one launch of a block
// per (row, key head): the preparation above (prep: q, k, v and g unused, beta read, not written),
// the recurrence of kda_decode_batched's shared-memory layout `layout` (1 or 3:
// kda_decode_auto_layout) over each of the key head's Hv / Hk value heads, and the output norm
// rmsnorm_gated with gate sigmoid(gate), or silu(gate) when gate_silu (Gated DeltaNet), into out.
//   state_pool [state_slots, Hv, dk, dv] f32 (16-byte aligned), scale: q's in the recurrence;
//   norm_w [dv] f32, norm_order: rmsnorm_gated's order for out's rows; gate, out [B, Hv, dv] of
//   the activation type (prep.act_bf16). Conv states of the activation type (prep.pool_bf16 ==
//   prep.act_bf16), dv % 4 == 0, dk <= 256; smem_bytes: kda_decode_step_smem's.
struct KdaDecodeStepArgs {
  KdaDecodePrepArgs prep;
  float* state_pool = nullptr;
  int64_t state_slots = 0;
  float scale = 1.0f;
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  NormOrder norm_order;
  const void* gate = nullptr;
  bool gate_silu = false;
  void* out = nullptr;
  int layout = 1;
};
// The dynamic shared memory a kda_decode_step block takes (the whole state of a head staged).
size_t kda_decode_step_smem(const KdaDecodeStepArgs& a);
// The most dynamic shared memory a block may have on the current device.
size_t kda_decode_step_smem_limit();
// The blocks of kda_decode_step resident at once on the current device (two a multiprocessor).
// Past one such wave each block's serial phases (preparation, recurrence, norm) repeat per wave,
// and the separate kernels are faster (B = 64 x 32 heads: 128 against 101 us, H200).
int64_t kda_decode_step_wave_blocks();
void kda_decode_step(cudaStream_t stream, const KdaDecodeStepArgs& a);

// rmsnorm_gated: out = rmsnorm(x, w, eps, weight_offset) * sigmoid(gate), the norm rounded to
// out's type before the multiply (as rmsnorm_forward into out, then mul_sigmoid_inplace(out)).
// x, out [rows, d] (x_bf16, out_bf16; out may alias x with the same type), w [d] f32, gate
// [rows * d] (gate_bf16). order: the norm's reduction (norm_order of d with x, out and w's
// alignment).
void rmsnorm_gated(cudaStream_t stream, const void* x, bool x_bf16, const float* w,
                   const void* gate, bool gate_bf16, void* out, bool out_bf16, int64_t rows,
                   int64_t d, float eps, float weight_offset, NormOrder order);

}  // namespace loom::cuda::launch
