// Causal depthwise conv1d: one thread per (token, channel), taps summed j = 0..W-1 in the CPU
// kernel's order. The prefill's state update runs as a second launch (after every output has read
// the old state); the decode step shifts each (sequence, channel) window inside its own thread.
#include "kernels/cuda/common.cuh"

namespace loom::cuda {
namespace {

__global__ void conv_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    const float* __restrict__ state, float* __restrict__ out,
                                    int64_t T, int64_t C, int64_t W, bool silu) {
  const int64_t P = W - 1;
  const int64_t n = T * C;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx % C;
    const float* wc = w + c * W;
    float acc = 0.0f;
    for (int64_t j = 0; j < W; ++j) {
      const int64_t p = t + j;  // row of xpad = concat(state, x)
      const float xv = p < P ? state[p * C + c] : x[(p - P) * C + c];
      acc += wc[j] * xv;
    }
    out[idx] = silu ? dev::silu(acc) : acc;
  }
}

// New state row i = xpad row T + i; walking i upwards reads rows >= i of the old state only.
__global__ void conv_state_kernel(const float* __restrict__ x, float* state, int64_t T, int64_t C,
                                  int64_t P) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t i = 0; i < P; ++i) {
      const int64_t p = T + i;
      state[i * C + c] = p < P ? state[p * C + c] : x[(p - P) * C + c];
    }
  }
}

__global__ void conv_step_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 float* __restrict__ states, float* __restrict__ out, int64_t B,
                                 int64_t C, int64_t W, bool silu) {
  const int64_t P = W - 1;
  const int64_t n = B * C;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = idx / C, c = idx % C;
    float* st = states + b * P * C + c;
    const float* wc = w + c * W;
    const float xv = x[idx];
    float acc = 0.0f;
    for (int64_t j = 0; j < P; ++j) acc += wc[j] * st[j * C];
    acc += wc[P] * xv;
    out[idx] = silu ? dev::silu(acc) : acc;
    for (int64_t j = 0; j + 1 < P; ++j) st[j * C] = st[(j + 1) * C];
    if (P > 0) st[(P - 1) * C] = xv;
  }
}

constexpr int kThreads = 256;

}  // namespace

namespace launch {

void causal_conv1d_forward(cudaStream_t stream, const float* x, const float* w, float* state,
                           float* out, int64_t T, int64_t C, int64_t W, bool silu) {
  if (C == 0) return;
  cudaStream_t s = stream;
  if (T > 0) {
    conv_forward_kernel<<<dev::grid_for(T * C, kThreads), kThreads, 0, s>>>(x, w, state, out, T, C,
                                                                            W, silu);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (W > 1 && T > 0) {
    conv_state_kernel<<<dev::grid_for(C, kThreads), kThreads, 0, s>>>(x, state, T, C, W - 1);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

void causal_conv1d_step(cudaStream_t stream, const float* x, const float* w, float* states,
                        float* out, int64_t B, int64_t C, int64_t W, bool silu) {
  if (B * C == 0) return;
  conv_step_kernel<<<dev::grid_for(B * C, kThreads), kThreads, 0, stream>>>(x, w, states, out, B, C,
                                                                            W, silu);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
