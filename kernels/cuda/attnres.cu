// Block-AttnRes aggregation on the GPU (kernels/attnres.h's formula): one block per token, the
// token's slice of the D features spread over the threads (element j at thread j % threads), kept
// in registers. For each source in order: one block reduction gives both sum(v^2) and
// sum(v * r * w), the logit is the latter times 1 / rms(v), and the softmax over depth is taken
// online as the CPU twin takes it (a larger logit rescales the running sum and mix), so each
// source is read once. Then the mix is divided by the sum, normalised (a third reduction) and
// scaled by out_norm. exp is evaluated in double and rounded to f32, as the CPU's expf rounds.
// Every output row depends on its own token only: batch-invariant. A bf16 output is the f32
// result rounded to nearest even as it is stored.
#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/attnres_launch.h"
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

__device__ __forceinline__ float exp_as_host(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// Both sums over the block (blockDim.x a multiple of 32); `smem` holds 64 floats.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  a = dev::warp_sum(a);
  b = dev::warp_sum(b);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) {
    smem[warp] = a;
    smem[32 + warp] = b;
  }
  __syncthreads();
  a = dev::warp_sum(lane < nwarps ? smem[lane] : 0.0f);
  b = dev::warp_sum(lane < nwarps ? smem[32 + lane] : 0.0f);
}

template <int VPT, class TO>
__global__ void __launch_bounds__(256)
    attnres_kernel(const float* __restrict__ src, const float* __restrict__ w,
                   const float* __restrict__ r, const float* __restrict__ o, float eps,
                   TO* __restrict__ out, int64_t S, int64_t N, int64_t D) {
  __shared__ float red[64];
  const int64_t t = blockIdx.x;
  const int nt = blockDim.x;
  const float fd = static_cast<float>(D);
  float rw[VPT], acc[VPT], v[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * nt;
    rw[k] = j < D ? r[j] * w[j] : 0.0f;
    acc[k] = 0.0f;
  }
  float mx = 0.0f, z = 0.0f;
  for (int64_t i = 0; i < S; ++i) {
    const float* row = src + (i * N + t) * D;
    float ss = 0.0f, q = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * nt;
      v[k] = j < D ? row[j] : 0.0f;
      ss += v[k] * v[k];
      q += v[k] * rw[k];
    }
    block_sum2(ss, q, red);
    const float dot = q * (1.0f / sqrtf(ss / fd + eps));
    if (i == 0) {
      mx = dot;
      z = 1.0f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) acc[k] = v[k];
      continue;
    }
    if (dot > mx) {
      const float scale = exp_as_host(mx - dot);
      z *= scale;
#pragma unroll
      for (int k = 0; k < VPT; ++k) acc[k] *= scale;
      mx = dot;
    }
    const float p = exp_as_host(dot - mx);
    z += p;
#pragma unroll
    for (int k = 0; k < VPT; ++k) acc[k] += p * v[k];
  }
  const float inv_z = 1.0f / z;
  float ss = 0.0f, unused = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    acc[k] *= inv_z;
    ss += acc[k] * acc[k];
  }
  block_sum2(ss, unused, red);
  const float inv = 1.0f / sqrtf(ss / fd + eps);
  TO* dst = out + t * D;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(k) * nt;
    if (j >= D) continue;
    const float y = acc[k] * inv * o[j];
    if constexpr (std::is_same_v<TO, float>) {
      dst[j] = y;
    } else {
      dst[j] = __float2bfloat16_rn(y);
    }
  }
}

template <int VPT>
void run(cudaStream_t stream, int threads, const float* sources, const float* query,
         const float* key_norm, const float* out_norm, float eps, void* out, bool out_bf16,
         int64_t S, int64_t N, int64_t D) {
  const unsigned blocks = static_cast<unsigned>(N);
  if (out_bf16) {
    attnres_kernel<VPT><<<blocks, threads, 0, stream>>>(sources, query, key_norm, out_norm, eps,
                                                        static_cast<__nv_bfloat16*>(out), S, N, D);
  } else {
    attnres_kernel<VPT><<<blocks, threads, 0, stream>>>(sources, query, key_norm, out_norm, eps,
                                                        static_cast<float*>(out), S, N, D);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

void attnres_aggregate(cudaStream_t stream, const float* sources, const float* query,
                       const float* key_norm, const float* out_norm, float eps, void* out,
                       bool out_bf16, int64_t S, int64_t N, int64_t D) {
  if (N == 0 || D == 0) return;
  LOOM_CHECK_GRID(N);
  // Up to 256 features: one per thread; then 256 threads with up to 64 features each.
  int threads = 256;
  const int64_t per = (D + threads - 1) / threads;
  if (D <= 256) threads = static_cast<int>((D + 31) / 32 * 32);
  if (per <= 1)
    return run<1>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N, D);
  if (per <= 2)
    return run<2>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N, D);
  if (per <= 4)
    return run<4>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N, D);
  if (per <= 8)
    return run<8>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N, D);
  if (per <= 16)
    return run<16>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N,
                   D);
  if (per <= 32)
    return run<32>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N,
                   D);
  return run<64>(stream, threads, sources, query, key_norm, out_norm, eps, out, out_bf16, S, N, D);
}

}  // namespace launch
}  // namespace loom::cuda
