// Raw launchers of the varlen KDA / Gated DeltaNet kernels (kernels/cuda/kda_chunked.cu). Like
// launch.h this header includes no Loom or Abseil header, so nvcc never parses Abseil; the
// Tensor-level entry points and their checks are in kernels/cuda/kda_chunked.{h,cc}.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::launch {

// One varlen delta-rule call: sequence b is rows [cu[b], cu[b + 1]) of q, k [N, Hk, dk],
// v and out [N, Hv, dv], g [N, Hv, dk] (or [N, Hv, 1] when scalar_g), beta [N, Hv]; its f32
// state is pool[slots[b]] ([num_slots, Hv, dk, dv], updated in place). q, k, v and out are bf16
// when `bf16`, else f32; beta is bf16 when `beta_bf16`, else f32; g is f32. cu and slots live on
// the device. The chunked form also takes out == null (the output is not written) and, for the
// chunked backward, state_before: f32 [chunks, Hv, dk, dv] that receives the state before each
// chunk, chunk numbered as in the workspace's chunk table (kda_chunked_chunk_table).
struct KdaVarlenArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const void* beta = nullptr;
  void* out = nullptr;
  float* pool = nullptr;
  const int32_t* slots = nullptr;
  const int64_t* cu = nullptr;
  float* state_before = nullptr;
  float scale = 1.0f;
  int64_t B = 0, N = 0, num_slots = 0;
  int Hk = 0, Hv = 0, dk = 0, dv = 0;
  bool scalar_g = false, bf16 = false, beta_bf16 = false;
};

// The token recurrence for every sequence of at most `rmax` rows (the others are left alone):
// one block per (value head, 32 value columns, sequence). dk <= 256.
void kda_recurrent_varlen(cudaStream_t stream, const KdaVarlenArgs& a, int64_t rmax);

// The chunked (WY/UT) form for every sequence of more than `rmax` rows. Supported when
// kda_chunked_supported(a): dk <= 128, dk and dv multiples of 8, q, k, v, out 16-byte aligned.
// `workspace` holds kda_chunked_workspace_bytes(a) bytes (device). bv: value columns per block of
// the state pass, 32 or 64 (0: picked by shape). phases (benchmarks): bit 0 runs the chunk table
// and the per-chunk preparation, bit 1 the state pass (which reads what the former left in the
// workspace).
bool kda_chunked_supported(const KdaVarlenArgs& a);
size_t kda_chunked_workspace_bytes(const KdaVarlenArgs& a);
void kda_chunked_varlen(cudaStream_t stream, const KdaVarlenArgs& a, int64_t rmax, void* workspace,
                        int bv = 0, int phases = 3);

// The chunk table at the head of a workspace that kda_chunked_varlen filled: i32 [B + 1] on the
// device, entry b the global number of sequence b's first chunk, entry B the number of chunks.
const int32_t* kda_chunked_chunk_table(const void* workspace);

// The reverse of the chunked form's state pass, for the chunked backward (f32 only, a.bf16 false;
// after kda_chunked_varlen with rmax 0 filled `workspace`): per sequence, from the gradient of its
// final state (d_final [B, Hv, dk, dv], or zero when null), walks its chunks last first and writes
// the gradient of the state after each chunk to d_state_after (f32 [chunks, Hv, dk, dv], chunks
// numbered as in the chunk table) and, when d_initial is not null, that of the initial state
// ([B, Hv, dk, dv]). d_out: f32 [N, Hv, dv], the output's gradient. Uses only what the
// preparation left in the workspace (W, QG, KG, P and the chunk decay), not the states:
//   dv_new = P^T dO + KG dS,   dS <- diag(decay) dS + QG^T dO - W^T dv_new.
void kda_chunked_state_backward(cudaStream_t stream, const KdaVarlenArgs& a, const void* workspace,
                                const float* d_out, const float* d_final, float* d_state_after,
                                float* d_initial);

// Test hook for the warp-level bf16 tensor-core GEMM of the chunked kernels: with A [64, 64] and
// B [64, 32] row-major bf16 (as uint16 bits) on the device, writes C = A B and Ct = A^T B
// ([64, 32] f32 each) computed by the kernels' fragment loaders and mma.sync.
void kda_mma_selftest(cudaStream_t stream, const uint16_t* A, const uint16_t* B, float* C,
                      float* Ct);

// Batched one-token decode (kernels/cuda/kda_decode.cu) with bf16 q, k, v, out (and beta when
// beta_bf16); g and the state pool f32. Same contract as kda_decode_batched in launch.h.
void kda_decode_batched_bf16(cudaStream_t stream, const void* q, const void* k, const void* v,
                             const float* g, const void* beta, bool beta_bf16, float scale,
                             float* state_pool, const int32_t* state_slots, void* out, int64_t B,
                             int64_t num_slots, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv,
                             bool scalar_g, int layout = 0);

// The layout kda_decode_batched's `layout = 0` picks for B rows of Hv heads of dv columns when
// its vector condition holds (dv % 4 == 0, 16-byte aligned state, v and out): 3 (64-column tiles)
// when they give every SM several blocks, else 1 (16-column tiles). kda_decode_step takes the
// same one, hence the same reduction order.
int kda_decode_auto_layout(int64_t B, int64_t Hv, int64_t dv);

}  // namespace loom::cuda::launch
