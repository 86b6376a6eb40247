// Raw CUDA launchers behind the loom::cuda:: Tensor entry points. This header is shared by the
// host-side .cc files (compiled by the C++ compiler; they check shapes and devices) and the .cu
// files (compiled by nvcc; they hold the kernels). It deliberately includes no Loom or Abseil
// header so that nvcc never parses Abseil. Every launcher enqueues on the stream it is given (the
// Exec's) and checks the launch with LOOM_CUDA_CHECK(cudaGetLastError()); none synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace loom::cuda {

namespace detail {
[[noreturn]] inline void cuda_failed(cudaError_t e, const char* call, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: CUDA call %s failed: %s (%s)\n", file, line, call,
               cudaGetErrorString(e), cudaGetErrorName(e));
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail
}  // namespace loom::cuda

// Aborts with file:line, the call's text and cudaGetErrorString when a CUDA runtime call fails.
#define LOOM_CUDA_CHECK(call)                                                       \
  do {                                                                              \
    const cudaError_t loom_cuda_err_ = (call);                                      \
    if (loom_cuda_err_ != cudaSuccess) [[unlikely]]                                 \
      ::loom::cuda::detail::cuda_failed(loom_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

namespace loom::cuda::launch {

// Activation arrays passed as void* hold f32, or bf16 where the flag beside them says so; the
// kernels compute in f32 and round bf16 stores to nearest even. Parameters stay f32.

// norm: out = (w_off + w) * x * rsqrt(mean x^2 + eps) (rms) or x * scale * rsqrt(sum x^2 + eps).
// out may alias x when both have the same type.
void rmsnorm(cudaStream_t stream, const void* x, bool x_bf16, const float* w, void* out,
             bool out_bf16, int64_t rows, int64_t d, float eps, float weight_offset);
void l2norm(cudaStream_t stream, const void* x, bool x_bf16, void* out, bool out_bf16, int64_t rows,
            int64_t d, float eps, float scale);
// x += delta (stored rounded as x's type), then rmsnorm of that x into out (out may alias x).
void add_rmsnorm(cudaStream_t stream, void* x, bool x_bf16, const void* delta, bool delta_bf16,
                 const float* w, void* out, bool out_bf16, int64_t rows, int64_t d, float eps,
                 float weight_offset);

// elementwise
enum class Unary : int { kAdd, kMulSigmoid, kMulSilu, kSigmoid, kSiluMul };
// kAdd: x += y; kMulSigmoid: x *= sigmoid(y); kMulSilu: x *= silu(y); kSigmoid: x = sigmoid(x);
// kSiluMul: out = silu(x) * y (out may alias x when both have the same type). out_bf16 matters
// for kSiluMul only, y_bf16 for all but kSigmoid.
void pointwise(cudaStream_t stream, Unary op, void* x, bool x_bf16, const void* y, bool y_bf16,
               void* out, bool out_bf16, int64_t n);
void add_bias(cudaStream_t stream, void* x, bool x_bf16, const float* bias, int64_t rows,
              int64_t cols);
void mul_sigmoid_rows(cudaStream_t stream, void* x, bool x_bf16, const void* gate, bool gate_bf16,
                      int64_t rows, int64_t cols);
// dst[r, c] = src[r, c] for rows x cols elements with row strides dst_ld and src_ld (in
// elements); a plain 2-D copy when the types match, a converting one otherwise.
void copy_2d(cudaStream_t stream, void* dst, bool dst_bf16, int64_t dst_ld, const void* src,
             bool src_bf16, int64_t src_ld, int64_t rows, int64_t cols);
// out[i, :] = table[ids[i], :]. Ids outside [0, V) write a zero row and lower *bad (if non-null)
// to min(*bad, i) with atomicMin, so the host can report the first bad position.
void gather_rows_i32(cudaStream_t stream, const int32_t* ids, const void* table, bool table_bf16,
                     void* out, bool out_bf16, int64_t n, int64_t V, int64_t d, int32_t* bad);
void gather_rows_i64(cudaStream_t stream, const int64_t* ids, const void* table, bool table_bf16,
                     void* out, bool out_bf16, int64_t n, int64_t V, int64_t d, int32_t* bad);
void fill_or_scale(cudaStream_t stream, float* x, int64_t n,
                   float beta);  // x = beta == 0 ? 0 : beta * x
// out[i] = alpha * w[i, :] . x + beta * out[i] for row-major w [n, k]; beta = 0 never reads out.
void gemv_rows(cudaStream_t stream, const float* w, const float* x, float* out, int64_t n,
               int64_t k, float alpha, float beta);
// The same with x bf16 (raw bits), widened exactly: the bits gemv_rows gives on x widened first.
void gemv_rows_bf16x(cudaStream_t stream, const float* w, const uint16_t* x, float* out, int64_t n,
                     int64_t k, float alpha, float beta);

// conv
void causal_conv1d_forward(cudaStream_t stream, const float* x, const float* w, float* state,
                           float* out, int64_t T, int64_t C, int64_t W, bool silu);
void causal_conv1d_step(cudaStream_t stream, const float* x, const float* w, float* states,
                        float* out, int64_t B, int64_t C, int64_t W, bool silu);

// kda
// f is f32 or bf16 (f_bf16); g f32.
void kda_gate(cudaStream_t stream, const void* f, bool f_bf16, const float* A_log,
              const float* dt_bias, float lower_bound, float* g, int64_t T, int64_t width,
              int64_t H);
void kda_recurrent(cudaStream_t stream, const float* q, const float* k, const float* v,
                   const float* g, const float* beta, float scale, float* state, float* out,
                   int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool scalar_g);

// Batched decode (kda_decode.cu): one token for each of B sequences, sequence b's state at slot
// state_slots[b] of state_pool [num_slots, Hv, dk, dv] (updated in place; slots < 0 are padding:
// out row zero, no state touched). q, k [B, Hk, dk], v and out [B, Hv, dv], g [B, Hv, dk] or
// [B, Hv, 1] (scalar_g), beta [B, Hv]. layout 0 picks the block layout by shape; 1..7 force one
// for tests and benchmarks: 1..5 shared-memory tiles of 16, 32, 64 (8 warps), 64 (4 warps) and
// 128 columns (need dv % 4 == 0 and 16-byte aligned state, v and out), 6 register-resident
// scalar (any dv), 7 register-resident 32 columns.
inline constexpr int kKdaDecodeLayouts = 7;
void kda_decode_batched(cudaStream_t stream, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, float scale, float* state_pool,
                        const int32_t* state_slots, float* out, int64_t B, int64_t num_slots,
                        int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool scalar_g,
                        int layout = 0);

// rope: x f32 or bf16 (x_bf16), rotated in place; positions [T] i64 and inv_freq [rd/2] on the
// device. inverse: rope_backward's transposed rotation (kernels/rope.h).
void rope(cudaStream_t stream, void* x, bool x_bf16, const int64_t* positions,
          const float* inv_freq, float attention_factor, int64_t T, int64_t H, int64_t d,
          int64_t rotary_dim, int64_t dim_offset, bool interleaved, bool inverse = false);

}  // namespace loom::cuda::launch
