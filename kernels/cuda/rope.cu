// RoPE: one block per (token, head); the rotated slice is staged in shared memory (f32, whatever
// x's type) so the interleaved style's de-interleaving permutation can run in place. cos/sin of
// the f32 angle inv_freq[i] * position, as the CPU kernel computes them (accurate cosf/sinf, no
// fast math); a bf16 x is rotated in f32 and rounded once when stored.
#include "kernels/cuda/bf16_io.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

template <typename T>
__global__ void rope_kernel(T* x, const int64_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float af, int64_t H, int64_t d,
                            int rd, int64_t off, bool interleaved, bool inverse) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  extern __shared__ float buf[];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  T* v = x + (t * H + h) * d + off;
  for (int i = threadIdx.x; i < rd; i += blockDim.x) buf[i] = dev::ld(v + i);
  __syncthreads();
  const float pos = static_cast<float>(positions[t]);
  const int half = rd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = inv_freq[i] * pos;
    const float c = cosf(angle) * af, s = sinf(angle) * af;
    const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    if (!inverse) {
      const float a = buf[ia], b = buf[ib];
      dev::st(v + i, a * c - b * s);
      dev::st(v + i + half, b * c + a * s);
    } else {  // the transposed rotation, pairs written back where the forward read them
      const float p = buf[i], q = buf[i + half];
      dev::st(v + ia, p * c + q * s);
      dev::st(v + ib, q * c - p * s);
    }
  }
}

}  // namespace

namespace launch {
void rope(cudaStream_t stream, void* x, bool x_bf16, const int64_t* positions,
          const float* inv_freq, float attention_factor, int64_t T, int64_t H, int64_t d,
          int64_t rotary_dim, int64_t dim_offset, bool interleaved, bool inverse) {
  if (T == 0 || H == 0 || rotary_dim == 0) return;
  LOOM_CHECK_GRID(T);
  if (H > 65535) {
    std::fprintf(stderr, "rope (CUDA): %lld heads exceed the grid's y limit\n",
                 static_cast<long long>(H));
    std::abort();
  }
  const int half = static_cast<int>(rotary_dim / 2);
  const int threads = half >= 128 ? 128 : (half >= 64 ? 64 : 32);
  const size_t smem = static_cast<size_t>(rotary_dim) * sizeof(float);
  if (smem > 48 * 1024) {
    std::fprintf(stderr, "rope (CUDA): rotary_dim %lld too large\n",
                 static_cast<long long>(rotary_dim));
    std::abort();
  }
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(H));
  dev::with_elem(x_bf16, [&](auto xt) {
    using X = typename decltype(xt)::type;
    LOOM_MARK_PDL_KERNEL(rope_kernel<X>);
    rope_kernel<X><<<grid, threads, smem, stream>>>(
        static_cast<X*>(x), positions, inv_freq, attention_factor, H, d,
        static_cast<int>(rotary_dim), dim_offset, interleaved, inverse);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}
}  // namespace launch
}  // namespace loom::cuda
