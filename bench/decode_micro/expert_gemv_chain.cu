// Micro-benchmark: batch-1 routed-expert GEMVs (48B shape: E 256, D 2304, I 1024, top-8), 26
// layers' worth cycling over 4 layers of distinct weights (14.5 GB, far past L2), replayed as a
// CUDA graph with programmatic edges. Variants of moe_gemm.cu's gv::kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/cuda/moe_gemm_common.cuh"

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

using bf16 = __nv_bfloat16;
using loom::cuda::moe_gemm::kFull;
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16), f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16), f[7] = __uint_as_float(v.w & 0xffff0000u);
}
__device__ __forceinline__ void ld_x8(const float* p, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void ld_x8(const bf16* p, float (&f)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), f);
}
__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// Loom's own tile searches (kernels/cuda/moe_gemm_common.cuh): find_tile (staged offsets, every
// warp) and find_tile_block (one block scan).
using loom::cuda::moe_gemm::find_tile;
using loom::cuda::moe_gemm::find_tile_block;
using loom::cuda::moe_gemm::Tile;

struct P {
  const void* a;
  const bf16* b0;
  const bf16* b1;
  const int32_t* off;
  const int4* tiles;  // variant B/C: the slot's tile
  int E, R, N, K;
  void* out;  // h (f32) for dual, y (f32) for down
};

constexpr int kWarps = 8, BM = 2;

// mode 0: the kernel before (offsets staged in shared memory, find_tile in every warp);
// 1: the tile read from a list (one int4); 2: as 1 with all of a lane's loads in flight (KS
// k-steps a lane, K == KS * 256); 4: as 1 with mode 0's shared array declared (occupancy and
// carve-out unchanged); 5: mode 0 for gate/up, 1 for down; 6: find_tile_block in both.
template <bool kDual, typename AT, int kMode, int KS>
__global__ void __launch_bounds__(kWarps * 32) gv_kernel(P p, int col_blocks) {
  pdl_trigger();
  pdl_wait();
  Tile t;
  if constexpr (kMode == 0) {
    __shared__ int32_t off[4097];
    for (int e = threadIdx.x; e <= p.E; e += blockDim.x) off[e] = p.off[e];
    __syncthreads();
    t = find_tile(off, p.E, p.R, blockIdx.y, BM);
  } else if constexpr (kMode == 6) {
    t = find_tile_block<kWarps * 32>(p.off, p.E, p.R, blockIdx.y, BM);
  } else if constexpr (kMode == 4) {  // the tile read, with mode 0's static shared array declared
    __shared__ int32_t off4[4097];
    const int4 q = p.tiles[blockIdx.y];
    t.e = q.x, t.row0 = q.y, t.row_end = q.z;
    if (p.E < 0) {  // never: keeps the array
      off4[threadIdx.x] = t.e;
      __syncthreads();
      t.e = off4[(threadIdx.x + 1) & 255];
    }
  } else {
    const int4 q = p.tiles[blockIdx.y];
    t.e = q.x, t.row0 = q.y, t.row_end = q.z;
  }
  if (t.e < 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = min(BM, t.row_end - t.row0);
  const AT* a = static_cast<const AT*>(p.a) + int64_t(t.row0) * p.K;
  for (int cb = blockIdx.x; cb < col_blocks; cb += gridDim.x) {
    const int col = cb * kWarps + warp;
    if (col >= p.N) break;
    const int64_t wofs = (int64_t(t.e) * p.N + col) * p.K;
    const bf16* w0 = p.b0 + wofs;
    const bf16* w1 = kDual ? p.b1 + wofs : nullptr;
    float g[BM] = {}, u[BM] = {};
    if constexpr (kMode == 2) {
      uint4 v0[KS], v1[KS];
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        v0[s] = __ldcs(reinterpret_cast<const uint4*>(w0) + s * 32 + lane);
        if constexpr (kDual) v1[s] = __ldcs(reinterpret_cast<const uint4*>(w1) + s * 32 + lane);
      }
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        float wg[8], wu[8];
        unpack8(v0[s], wg);
        if constexpr (kDual) unpack8(v1[s], wu);
        const int k = (s * 32 + lane) * 8;
#pragma unroll
        for (int r = 0; r < BM; ++r) {
          if (r < rows) {
            float xf[8];
            ld_x8(a + int64_t(r) * p.K + k, xf);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              g[r] = fmaf(wg[e], xf[e], g[r]);
              if constexpr (kDual) u[r] = fmaf(wu[e], xf[e], u[r]);
            }
          }
        }
      }
    } else {
#pragma unroll 4
      for (int k = lane * 8; k < p.K; k += 32 * 8) {
        float wg[8], wu[8];
        unpack8(__ldcs(reinterpret_cast<const uint4*>(w0 + k)), wg);
        if constexpr (kDual) unpack8(__ldcs(reinterpret_cast<const uint4*>(w1 + k)), wu);
#pragma unroll
        for (int r = 0; r < BM; ++r) {
          if (r < rows) {
            float xf[8];
            ld_x8(a + int64_t(r) * p.K + k, xf);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              g[r] = fmaf(wg[e], xf[e], g[r]);
              if constexpr (kDual) u[r] = fmaf(wu[e], xf[e], u[r]);
            }
          }
        }
      }
    }
    float mg = 0.f, mu = 0.f;
#pragma unroll
    for (int r = 0; r < BM; ++r) {
      const float sg = warp_sum(g[r]);
      const float su = kDual ? warp_sum(u[r]) : 0.0f;
      if (lane == r) mg = sg, mu = su;
    }
    if (lane < rows) {
      const int64_t i = int64_t(t.row0 + lane) * p.N + col;
      if constexpr (kDual) {
        static_cast<float*>(p.out)[i] = silu(mg) * mu;
      } else {
        static_cast<float*>(p.out)[i] = mg;
      }
    }
  }
}

__global__ void tile_check(const int32_t* off, int E, int R, int slots, int* bad) {
  for (int slot = 0; slot < slots; ++slot) {
    const Tile a = find_tile(off, E, R, slot, BM), b = find_tile_block<256>(off, E, R, slot, BM);
    if (threadIdx.x == 0 &&
        (a.e != b.e || (a.e >= 0 && (a.row0 != b.row0 || a.row_end != b.row_end))))
      atomicAdd(bad, 1);
  }
}

bool g_pdl = true;
template <typename K, typename... A>
void launch(K kernel, dim3 grid, int threads, cudaStream_t s, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = g_pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int E = 256, D = 2304, I = 1024, TOPK = 8, LAYERS = 4, STEPS = 26;
  const size_t per = size_t(E) * I * D;
  std::vector<bf16*> wg(LAYERS), wu(LAYERS), wd(LAYERS);
  for (int l = 0; l < LAYERS; ++l) {
    CK(cudaMalloc(&wg[l], per * 2));
    CK(cudaMalloc(&wu[l], per * 2));
    CK(cudaMalloc(&wd[l], per * 2));
    CK(cudaMemset(wg[l], 0x3c, per * 2));
    CK(cudaMemset(wu[l], 0x3c, per * 2));
    CK(cudaMemset(wd[l], 0x3c, per * 2));
  }
  // Per step: distinct experts, offsets (one row each), tiles.
  std::vector<int32_t> h_off(size_t(STEPS) * (E + 1));
  std::vector<int4> h_tiles(size_t(STEPS) * TOPK);
  uint32_t r = 7;
  for (int s = 0; s < STEPS; ++s) {
    std::vector<int> ex;
    while (int(ex.size()) < TOPK) {
      r = r * 1664525u + 1013904223u;
      const int e = int((r >> 8) % E);
      if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
    }
    std::sort(ex.begin(), ex.end());
    int32_t* off = &h_off[size_t(s) * (E + 1)];
    int row = 0, j = 0;
    for (int e = 0; e <= E; ++e) {
      off[e] = row;
      if (e < E && j < TOPK && ex[j] == e)
        ++row, h_tiles[size_t(s) * TOPK + j] = int4{e, row - 1, row, 0}, ++j;
    }
  }
  int32_t* d_off;
  int4* d_tiles;
  CK(cudaMalloc(&d_off, h_off.size() * 4));
  CK(cudaMalloc(&d_tiles, h_tiles.size() * sizeof(int4)));
  CK(cudaMemcpy(d_off, h_off.data(), h_off.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_tiles, h_tiles.data(), h_tiles.size() * sizeof(int4), cudaMemcpyHostToDevice));
  bf16* x;
  float *h, *y;
  CK(cudaMalloc(&x, TOPK * D * 2));
  CK(cudaMemset(x, 0x3c, TOPK * D * 2));
  CK(cudaMalloc(&h, TOPK * I * 4));
  CK(cudaMalloc(&y, TOPK * D * 4));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  auto build = [&](int mode, int gu_grid_mode, int dn_grid_mode) {
    // grid_mode 0: current (min(sms * 8 / slots, cols)); 1: every column block its own block
    for (int s = 0; s < STEPS; ++s) {
      const int l = s % LAYERS;
      P up{x, wg[l], wu[l], d_off + s * (E + 1), d_tiles + s * TOPK, E, TOPK, I, D, h};
      P dn{h, wd[l], nullptr, d_off + s * (E + 1), d_tiles + s * TOPK, E, TOPK, D, I, y};
      const int slots = TOPK;
      const int cu = (I + kWarps - 1) / kWarps, cd = (D + kWarps - 1) / kWarps;
      const int gu = gu_grid_mode ? cu : std::min(sms * 8 / slots, cu);
      const int gd = dn_grid_mode ? cd : std::min(sms * 8 / slots, cd);
      if (mode == 0) {
        launch(gv_kernel<true, bf16, 0, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 0, 4>, dim3(gd, slots), 256, st, dn, cd);
      } else if (mode == 1) {
        launch(gv_kernel<true, bf16, 1, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 1, 4>, dim3(gd, slots), 256, st, dn, cd);
      } else if (mode == 4) {
        launch(gv_kernel<true, bf16, 4, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 4, 4>, dim3(gd, slots), 256, st, dn, cd);
      } else if (mode == 5) {  // mode 0 gate/up, mode 1 down (the engine's change)
        launch(gv_kernel<true, bf16, 0, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 1, 4>, dim3(gd, slots), 256, st, dn, cd);
      } else if (mode == 6) {
        launch(gv_kernel<true, bf16, 6, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 6, 4>, dim3(gd, slots), 256, st, dn, cd);
      } else {
        launch(gv_kernel<true, bf16, 2, 9>, dim3(gu, slots), 256, st, up, cu);
        launch(gv_kernel<false, float, 2, 4>, dim3(gd, slots), 256, st, dn, cd);
      }
    }
  };
  auto timed = [&](int mode, int gm_u, int gm_d) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    build(mode, gm_u, gm_d);
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
    const int reps = 20;
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms / reps;
  };
  const double bytes = double(STEPS) * TOPK * 3.0 * I * D * 2;
  std::printf("%s: %d steps x (gate|up + down) of %d experts, %.1f MB a step\n", prop.name, STEPS,
              TOPK, bytes / STEPS / 1e6);
  for (int pdl = 0; pdl < 2; ++pdl) {
    g_pdl = pdl;
    for (int mode : {0, 1, 2, 4, 5, 6})
      for (int gm = 0; gm < 2; ++gm) {
        const float ms = timed(mode, gm, gm);
        std::printf("pdl %d mode %d grid %d: %.3f ms  %.1f us/layer  %.0f GB/s\n", pdl, mode, gm,
                    ms, ms * 1e3 / STEPS, bytes / ms / 1e6);
      }
  }
  {
    int* bad;
    int32_t* o;
    CK(cudaMalloc(&bad, 4));
    CK(cudaMalloc(&o, 257 * 4));
    int total_bad = 0;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> ho(257);
      int row = 0;
      for (int e = 0; e <= 256; ++e) {
        ho[e] = row;
        r = r * 1664525u + 1013904223u;
        if ((r >> 24) % (trial % 5 + 2) == 0) row += (r >> 8) % (trial % 7 + 1) + 1;
      }
      if (trial % 3 == 0) ho[10] = ho[11] + 3;  // a bad (decreasing) offset, clamped alike
      CK(cudaMemset(bad, 0, 4));
      CK(cudaMemcpy(o, ho.data(), 257 * 4, cudaMemcpyHostToDevice));
      const int R = std::max(1, row - trial % 4);
      tile_check<<<1, 256>>>(o, 256, R, (R + 1) / 2 + 256 + 2, bad);
      int hb;
      CK(cudaMemcpy(&hb, bad, 4, cudaMemcpyDeviceToHost));
      total_bad += hb;
    }
    std::printf("find_tile_block vs find_tile: %d mismatches over 200 offset sets\n", total_bad);
  }
  // check: modes agree
  std::vector<float> y0(TOPK * D), y1(TOPK * D);
  for (int mode : {0, 1, 2, 4, 5, 6}) {
    g_pdl = true;
    CK(cudaMemset(y, 0, TOPK * D * 4));
    build(mode, 0, 0);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(mode ? y1.data() : y0.data(), y, TOPK * D * 4, cudaMemcpyDeviceToHost));
    if (mode) {
      int diff = 0;
      for (int i = 0; i < TOPK * D; ++i) diff += y0[i] != y1[i];
      std::printf("mode %d vs 0: %d differing of %d (y0[0] %g)\n", mode, diff, TOPK * D, y0[0]);
    }
  }
  return 0;
}
