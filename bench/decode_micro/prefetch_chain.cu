// Does an L2 prefetch on a side branch, issued where a decode layer runs its small latency-bound
// kernels, make the following GEMV faster? A layer-like chain: S(1) G(qkv) S(3) G(o) S(4)
// G(gate_up) G(down) S(1), 27 layers of distinct weights, a CUDA graph with programmatic edges.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16), f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16), f[7] = __uint_as_float(v.w & 0xffff0000u);
}
// the current GEMV design (S warps a row, 8 warps a block)
template <int S>
__global__ void __launch_bounds__(256)
    gemv(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x, float* __restrict__ out,
         int n, int k) {
  pdl_trigger();
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % S;
  const int64_t row = int64_t(blockIdx.x) * (8 / S) + warp / S;
  float acc = 0.f;
  if (row < n) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + row * k);
#pragma unroll 4
    for (int i = part * 32 + lane; i < k / 8; i += 32 * S) {
      float wf[8], xf[8];
      unpack8(__ldcs(wr + i), wf);
      unpack8(__ldg(reinterpret_cast<const uint4*>(x) + i), xf);
      for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], xf[e], acc);
    }
  }
  acc = warp_sum(acc);
  __shared__ float ps[8];
  if (lane == 0) ps[warp] = acc;
  __syncthreads();
  if (row < n && part == 0 && lane == 0) {
    float s = 0;
    for (int j = 0; j < S; ++j) s += ps[warp + j];
    out[row] = s;
  }
}
// a small latency-bound kernel (~one norm): 1 block reads 9 KB, reduces, writes
__global__ void small(const float* __restrict__ in, float* __restrict__ out, int n) {
  pdl_trigger();
  pdl_wait();
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[i] * in[i];
  s = warp_sum(s);
  __shared__ float ws[8];
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = 0;
  for (int j = 0; j < 8; ++j) t += ws[j];
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * rsqrtf(t / n + 1e-5f);
}
__global__ void prefetch(const char* p, int64_t bytes) {
  const int64_t chunk = 16384;
  for (int64_t o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * chunk; o < bytes;
       o += int64_t(gridDim.x) * blockDim.x * chunk) {
    const uint32_t b = uint32_t(bytes - o < chunk ? bytes - o : chunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(b) : "memory");
  }
}
struct M {
  int n, k;
  uint16_t* w;
};
int main() {
  cudaStream_t s, side;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const int L = 27;
  const int shapes[4][2] = {{12288, 2304}, {2304, 4096}, {16384, 2304}, {18432, 1024}};
  std::vector<M> ms;
  for (int l = 0; l < L; ++l)
    for (auto& sh : shapes) {
      M m{sh[0], sh[1], nullptr};
      size_t b = size_t(m.n) * m.k * 2;
      CK(cudaMalloc(&m.w, b));
      CK(cudaMemset(m.w, 0x3c, b));
      ms.push_back(m);
    }
  uint16_t* x;
  float *a, *b, *out;
  CK(cudaMalloc(&x, 1 << 20));
  CK(cudaMemset(x, 0x3c, 1 << 20));
  CK(cudaMalloc(&a, 1 << 20));
  CK(cudaMemset(a, 0, 1 << 20));
  CK(cudaMalloc(&b, 1 << 20));
  CK(cudaMalloc(&out, 1 << 20));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<cudaEvent_t> evs(4 * L * 2);
  for (auto& evt : evs) CK(cudaEventCreateWithFlags(&evt, cudaEventDisableTiming));
  auto L_ = [&](auto kernel, int blocks, int threads, cudaStream_t st, auto... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kernel, args...));
  };
  auto G = [&](const M& m) {
    int S = 1;
    while (S < 8 && int64_t(m.n) * S < 8192 && m.k / (2 * S) >= 256) S *= 2;
    const int blocks = (m.n + 8 / S - 1) / (8 / S);
    if (S == 1)
      L_(gemv<1>, blocks, 256, s, m.w, x, out, m.n, m.k);
    else if (S == 2)
      L_(gemv<2>, blocks, 256, s, m.w, x, out, m.n, m.k);
    else if (S == 4)
      L_(gemv<4>, blocks, 256, s, m.w, x, out, m.n, m.k);
    else
      L_(gemv<8>, blocks, 256, s, m.w, x, out, m.n, m.k);
  };
  auto Sm = [&](int n) {
    for (int i = 0; i < n; ++i) L_(small, 1, 256, s, (const float*)a, b, 2304);
  };
  int ev = 0;
  std::vector<cudaEvent_t> joins;
  auto P = [&](const M& m, int64_t mb, int blocks) {  // fork a prefetch of m's first mb MB
    if (mb <= 0) return;
    CK(cudaEventRecord(evs[ev], s));
    CK(cudaStreamWaitEvent(side, evs[ev], 0));
    ++ev;
    const int64_t bytes = std::min<int64_t>(mb << 20, int64_t(m.n) * m.k * 2);
    prefetch<<<blocks, 32, 0, side>>>(reinterpret_cast<const char*>(m.w), bytes);
    CK(cudaEventRecord(evs[ev], side));
    joins.push_back(evs[ev]);
    ++ev;
  };
  auto run = [&](int64_t mb, int pblocks) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ev = 0;
    joins.clear();
    for (int l = 0; l < L; ++l) {
      const M* m = &ms[4 * l];
      P(m[0], mb, pblocks);
      Sm(1);
      G(m[0]);
      P(m[1], mb, pblocks);
      Sm(3);
      G(m[1]);
      P(m[2], mb, pblocks);
      Sm(4);
      G(m[2]);
      G(m[3]);
      Sm(1);
    }
    for (auto jv : joins) CK(cudaStreamWaitEvent(s, jv, 0));
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return t / 10;
  };
  double bytes = 0;
  for (auto& m : ms) bytes += double(m.n) * m.k * 2;
  for (int64_t mb : {0, 4, 8, 16, 24, 32})
    for (int pb : {1, 4, 16}) {
      if (mb == 0 && pb > 1) continue;
      const float t = run(mb, pb);
      std::printf("prefetch %2lld MB (%2d blocks): step %.3f ms  %.0f GB/s of weights\n",
                  (long long)mb, pb, t, bytes / t / 1e6);
    }
  return 0;
}
