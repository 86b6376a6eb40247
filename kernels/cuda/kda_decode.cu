// Batched recurrent KDA / Gated DeltaNet decode: one token for each of B sequences whose states
// live in a slot pool, each state read once and written once.
//
// Why one pass over the state suffices. For one (sequence, value head) with decayed state
// s = diag(e) S, e = exp(g), the step is u = beta (v - s^T k), S' = s + k u^T, o = S'^T q. Since
// o = s^T q + u (q . k), both column reductions (s^T k and s^T q) and the scalar q . k can be
// formed from the state as loaded and reduced together in one round (one barrier per block), and
// S' is written from the copy the block already holds: no second pass over global memory.
//
// Tiling. A block owns C = LPR * VW whole value columns of one head over all dk rows, so the
// reduction over rows never leaves the block. Lane (rl, cl) of a warp handles VW consecutive
// columns (a 16-byte float4 when VW = 4) of rows r = rl + RPW * warp + RP * i, so one warp
// instruction covers RPW = 32 / LPR row segments of C * 4 bytes and a block RP = WARPS * RPW rows.
// The row reduction is a shuffle over the rl lanes, then a sum over warps in shared memory. The
// grid is flat over (sequence, head, column tile), the tiles of one head adjacent.
//
// Two kernels share that tiling:
//  - kda_decode_smem_kernel (every layout with dv % 4 == 0): the block's state tile is copied to
//    shared memory with cp.async. A copy in flight costs no register, so a multiprocessor keeps
//    as many tiles in flight as its shared memory holds (5 blocks of 39 KB at C = 64, dk = 128:
//    160 KB of state requested at once per SM). Keeping the tile in registers instead
//    (kda_decode_kernel) caps that at ~80 KB (5 blocks of 96 registers a thread), which
//    measured 3.2 TB/s against this kernel's 3.95 TB/s at B = 256 (bench/results/gpu-h200.md).
//  - kda_decode_kernel: state in registers, any dv (VW = 1 when dv % 4 != 0 or a row is not
//    16-byte aligned).
// State stores are evict-first (__stcs): written once per step, they should not push the step's
// q, k, g and v out of L2 (measured: B = 1 in 3.44 us instead of 3.64 us, no change at B = 256).
//
// Slots: state_slots[b] < 0 marks a padding row (state untouched, out row zero), which lets a
// captured graph run a padded batch; a slot >= num_slots is a caller bug and yields a NaN out row
// (state untouched) rather than a write outside the pool.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/smem_opt_in.cuh"

namespace loom::cuda {
namespace {

constexpr int kMaxDk = 256;

using bf16 = __nv_bfloat16;

// Scalar loads and stores of the activations (q, k, v, out: f32 or bf16) and of beta (f32, or
// bf16 with the flag).
__device__ __forceinline__ float ld1(const float* p) { return *p; }
__device__ __forceinline__ float ld1(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st1(float* p, float x) { *p = x; }
__device__ __forceinline__ void st1(bf16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ float ld_beta(const void* p, int64_t i, bool bf) {
  return bf ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

template <int VW>
struct Vec;
template <>
struct Vec<4> {
  static __device__ __forceinline__ void load(const float* p, float (&x)[4]) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  }
  static __device__ __forceinline__ void load(const bf16* p, float (&x)[4]) {
    const uint2 t = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t.y));
    x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
  }
  static __device__ __forceinline__ void store(float* p, const float (&x)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  }
  static __device__ __forceinline__ void store(bf16* p, const float (&x)[4]) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(x[0], x[1]),
                         b = __floats2bfloat162_rn(x[2], x[3]);
    uint2 t;
    t.x = *reinterpret_cast<const uint32_t*>(&a);
    t.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(p) = t;
  }
  static __device__ __forceinline__ void store_state(float* p, const float (&x)[4]) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
  }
};
template <>
struct Vec<1> {
  template <class In>
  static __device__ __forceinline__ void load(const In* p, float (&x)[1]) {
    x[0] = ld1(p);
  }
  template <class In>
  static __device__ __forceinline__ void store(In* p, const float (&x)[1]) {
    st1(p, x[0]);
  }
  static __device__ __forceinline__ void store_state(float* p, const float (&x)[1]) {
    __stcs(p, x[0]);
  }
};

// Sums each column lane's NR partial sums over the block's rows: across the lanes of a warp that
// share the column (xor shuffles), then across warps through shared memory. Every thread ends
// with its column's totals. Both decode kernels reduce this way.
template <int NR, int LPR, int WARPS>
__device__ __forceinline__ void reduce_over_rows(float (&acc)[NR], int warp, int rl, int cl) {
#pragma unroll
  for (int o = LPR; o < 32; o <<= 1) {
#pragma unroll
    for (int x = 0; x < NR; ++x) acc[x] += __shfl_xor_sync(0xffffffffu, acc[x], o);
  }
  if constexpr (WARPS > 1) {
    __shared__ float red[WARPS][NR][LPR];
    if (rl == 0) {
#pragma unroll
      for (int x = 0; x < NR; ++x) red[warp][x][cl] = acc[x];
    }
    __syncthreads();
#pragma unroll
    for (int x = 0; x < NR; ++x) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) t += red[w][x][cl];
      acc[x] = t;
    }
  }
}

template <class In, int VW, int LPR, int WARPS, int NI>
__global__ void __launch_bounds__(WARPS * 32)
    kda_decode_kernel(const In* __restrict__ q, const In* __restrict__ k, const In* __restrict__ v,
                      const float* __restrict__ g, const void* __restrict__ beta, bool beta_bf16,
                      float scale, float* __restrict__ pool, const int32_t* __restrict__ slots,
                      In* __restrict__ out, int Hk, int Hv, int dk, int dv, int64_t num_slots,
                      int tiles, bool scalar_g) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  constexpr int C = LPR * VW;
  constexpr int RPW = 32 / LPR;
  constexpr int RP = WARPS * RPW;
  constexpr int NR = 2 * VW + 1;  // per column (e k)^T S and (e q)^T S, then q . k
  static_assert(32 % LPR == 0, "LPR divides the warp");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cl = lane % LPR, rl = lane / LPR;
  const int64_t bh = blockIdx.x / tiles;  // b * Hv + h
  const int tile = static_cast<int>(blockIdx.x - bh * tiles);
  const int h = static_cast<int>(bh % Hv);
  const int64_t b = bh / Hv;
  const int hk = h / (Hv / Hk);
  const int col = tile * C + cl * VW;
  const bool col_ok = col < dv;  // dv % VW == 0, so a vector is wholly in or out
  const bool out_lane = warp == 0 && rl == 0 && col_ok;
  In* o_row = out + bh * dv + col;

  const int row0 = warp * RPW + rl;

  // Per-row coefficients (shared by the LPR lanes of a row: broadcast loads, L1/L2 hits), issued
  // before the slot load so that their latency overlaps it.
  const In* k_row = k + (b * Hk + hk) * dk;
  const In* q_row = q + (b * Hk + hk) * dk;
  float kr[NI], qr[NI], er[NI];
#pragma unroll
  for (int it = 0; it < NI; ++it) {
    const int r = row0 + it * RP;
    const bool ok = r < dk;
    kr[it] = ok ? ld1(k_row + r) : 0.0f;
    qr[it] = ok ? ld1(q_row + r) * scale : 0.0f;
    er[it] = ok ? g[scalar_g ? bh : bh * dk + r] : -INFINITY;  // exp(-inf) = 0 on padding rows
  }
  const float bt = ld_beta(beta, bh, beta_bf16);
  float vv[VW];
  if (col_ok) {
    Vec<VW>::load(v + bh * dv + col, vv);
  } else {
#pragma unroll
    for (int c = 0; c < VW; ++c) vv[c] = 0.0f;
  }

  const int64_t slot = slots[b];
  if (slot < 0 || slot >= num_slots) {  // uniform over the block: no barrier is skipped unevenly
    if (out_lane) {
      const float fill = slot < 0 ? 0.0f : __int_as_float(0x7fc00000);
      float x[VW];
#pragma unroll
      for (int c = 0; c < VW; ++c) x[c] = fill;
      Vec<VW>::store(o_row, x);
    }
    return;
  }
  float* S_g = pool + (slot * Hv + h) * static_cast<int64_t>(dk) * dv + col;

  // All state loads first, so that each thread has NI loads in flight before any use.
  float S[NI][VW];
#pragma unroll
  for (int it = 0; it < NI; ++it) {
    const int r = row0 + it * RP;
    if (r < dk && col_ok) {
      Vec<VW>::load(S_g + static_cast<int64_t>(r) * dv, S[it]);
    } else {
#pragma unroll
      for (int c = 0; c < VW; ++c) S[it][c] = 0.0f;
    }
  }

#pragma unroll
  for (int it = 0; it < NI; ++it) er[it] = expf(er[it]);

  float acc[NR];
#pragma unroll
  for (int x = 0; x < NR; ++x) acc[x] = 0.0f;
#pragma unroll
  for (int it = 0; it < NI; ++it) {
#pragma unroll
    for (int c = 0; c < VW; ++c) {
      const float s = S[it][c] * er[it];
      S[it][c] = s;
      acc[c] = fmaf(kr[it], s, acc[c]);
      acc[VW + c] = fmaf(qr[it], s, acc[VW + c]);
    }
    acc[2 * VW] = fmaf(qr[it], kr[it], acc[2 * VW]);
  }

  reduce_over_rows<NR, LPR, WARPS>(acc, warp, rl, cl);

  float u[VW], o[VW];
#pragma unroll
  for (int c = 0; c < VW; ++c) {
    u[c] = bt * (vv[c] - acc[c]);
    o[c] = fmaf(u[c], acc[2 * VW], acc[VW + c]);
  }
  if (out_lane) Vec<VW>::store(o_row, o);

#pragma unroll
  for (int it = 0; it < NI; ++it) {
    const int r = row0 + it * RP;
    if (r < dk && col_ok) {
#pragma unroll
      for (int c = 0; c < VW; ++c) S[it][c] = fmaf(kr[it], u[c], S[it][c]);
      Vec<VW>::store_state(S_g + static_cast<int64_t>(r) * dv, S[it]);
    }
  }
}

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}

// The step with the block's state tile staged in shared memory by cp.async (see the top of the
// file for why). Each thread consumes exactly the 16-byte pieces it copied, so cp.async.wait_all
// alone orders them; the tile is read twice from shared memory (the reductions, then the update)
// and the decayed value s = e S is recomputed with the same rounding both times. Per-row k,
// scale q and e = exp(g) are staged once per block. Dynamic shared memory: dk * C floats of
// tile, then 3 * dk floats of coefficients.
template <class In, int LPR, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    kda_decode_smem_kernel(const In* __restrict__ q, const In* __restrict__ k,
                           const In* __restrict__ v, const float* __restrict__ g,
                           const void* __restrict__ beta, bool beta_bf16, float scale,
                           float* __restrict__ pool, const int32_t* __restrict__ slots,
                           In* __restrict__ out, int Hk, int Hv, int dk, int dv, int64_t num_slots,
                           int tiles, bool scalar_g) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  constexpr int VW = 4, C = LPR * VW, RPW = 32 / LPR, RP = WARPS * RPW, NR = 2 * VW + 1;
  extern __shared__ float4 smem4[];
  float* tile_s = reinterpret_cast<float*>(smem4);
  float* ks = tile_s + static_cast<int64_t>(dk) * C;
  float* qs = ks + dk;
  float* es = qs + dk;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cl = lane % LPR, rl = lane / LPR;
  const int64_t bh = blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x - bh * tiles);
  const int h = static_cast<int>(bh % Hv);
  const int64_t b = bh / Hv;
  const int hk = h / (Hv / Hk);
  const int col = tile * C + cl * VW;
  const bool col_ok = col < dv;
  const bool out_lane = warp == 0 && rl == 0 && col_ok;
  In* o_row = out + bh * dv + col;
  const int row0 = warp * RPW + rl;

  const int64_t slot = slots[b];
  if (slot < 0 || slot >= num_slots) {
    if (out_lane) {
      const float fill = slot < 0 ? 0.0f : __int_as_float(0x7fc00000);
      Vec<VW>::store(o_row, {fill, fill, fill, fill});
    }
    return;
  }
  float* S_g = pool + (slot * Hv + h) * static_cast<int64_t>(dk) * dv + col;
  if (col_ok) {
    for (int r = row0; r < dk; r += RP) cp_async16(tile_s + r * C + cl * VW, S_g + int64_t{r} * dv);
  }

  const In* k_row = k + (b * Hk + hk) * dk;
  const In* q_row = q + (b * Hk + hk) * dk;
  for (int i = threadIdx.x; i < dk; i += WARPS * 32) {
    ks[i] = ld1(k_row + i);
    qs[i] = ld1(q_row + i) * scale;
    es[i] = expf(g[scalar_g ? bh : bh * dk + i]);
  }
  const float bt = ld_beta(beta, bh, beta_bf16);
  float vv[VW] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col_ok) Vec<VW>::load(v + bh * dv + col, vv);
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();  // the coefficients

  float acc[NR];
#pragma unroll
  for (int x = 0; x < NR; ++x) acc[x] = 0.0f;
  if (col_ok) {
#pragma unroll 4
    for (int r = row0; r < dk; r += RP) {
      const float4 t = *reinterpret_cast<const float4*>(tile_s + r * C + cl * VW);
      const float e = es[r], kr = ks[r], qr = qs[r];
      const float x[VW] = {t.x * e, t.y * e, t.z * e, t.w * e};
#pragma unroll
      for (int c = 0; c < VW; ++c) {
        acc[c] = fmaf(kr, x[c], acc[c]);
        acc[VW + c] = fmaf(qr, x[c], acc[VW + c]);
      }
      acc[2 * VW] = fmaf(qr, kr, acc[2 * VW]);
    }
  }  // column lanes past dv: their sums are never used

  reduce_over_rows<NR, LPR, WARPS>(acc, warp, rl, cl);
  if (!col_ok) return;

  float u[VW], o[VW];
#pragma unroll
  for (int c = 0; c < VW; ++c) {
    u[c] = bt * (vv[c] - acc[c]);
    o[c] = fmaf(u[c], acc[2 * VW], acc[VW + c]);
  }
  if (out_lane) Vec<VW>::store(o_row, o);
#pragma unroll 4
  for (int r = row0; r < dk; r += RP) {
    const float4 t = *reinterpret_cast<const float4*>(tile_s + r * C + cl * VW);
    const float e = es[r], kr = ks[r];
    const float x[VW] = {fmaf(kr, u[0], t.x * e), fmaf(kr, u[1], t.y * e), fmaf(kr, u[2], t.z * e),
                         fmaf(kr, u[3], t.w * e)};
    Vec<VW>::store_state(S_g + int64_t{r} * dv, x);
  }
}

template <class In>
struct Args {
  const In *q, *k, *v;
  const float* g;
  const void* beta;
  bool beta_bf16;
  float scale;
  float* pool;
  const int32_t* slots;
  In* out;
  int Hk, Hv, dk, dv;
  int64_t num_slots, B;
  bool scalar_g;
};

// Launches kda_decode_kernel<VW, LPR, WARPS, NI> with the smallest instantiated NI covering dk.
// Register budget: NI * VW <= 64 state floats a thread (more spills); returns false when dk needs
// more rows a thread than that.
template <class In, int VW, int LPR, int WARPS>
bool launch_layout(cudaStream_t stream, const Args<In>& a) {
  constexpr int C = LPR * VW, RP = WARPS * 32 / LPR;
  const int ni = (a.dk + RP - 1) / RP;
  const int64_t tiles = (a.dv + C - 1) / C;
  const int64_t blocks = a.B * a.Hv * tiles;
  LOOM_CHECK_GRID(blocks);
  const auto go = [&](auto kernel) {
    mark_pdl_kernel(reinterpret_cast<const void*>(kernel));  // one of several instances
    kernel<<<static_cast<unsigned>(blocks), WARPS * 32, 0, stream>>>(
        a.q, a.k, a.v, a.g, a.beta, a.beta_bf16, a.scale, a.pool, a.slots, a.out, a.Hk, a.Hv, a.dk,
        a.dv, a.num_slots, static_cast<int>(tiles), a.scalar_g);
    return true;
  };
  if (ni <= 1) return go(kda_decode_kernel<In, VW, LPR, WARPS, 1>);
  if (ni <= 2) return go(kda_decode_kernel<In, VW, LPR, WARPS, 2>);
  if (ni <= 4) return go(kda_decode_kernel<In, VW, LPR, WARPS, 4>);
  if constexpr (8 * VW <= 64) {
    if (ni <= 8) return go(kda_decode_kernel<In, VW, LPR, WARPS, 8>);
  }
  if constexpr (16 * VW <= 64) {
    if (ni <= 16) return go(kda_decode_kernel<In, VW, LPR, WARPS, 16>);
  }
  if constexpr (32 * VW <= 64) {
    if (ni <= 32) return go(kda_decode_kernel<In, VW, LPR, WARPS, 32>);
  }
  return false;
}

template <class In, int LPR, int WARPS>
bool launch_smem_layout(cudaStream_t stream, const Args<In>& a) {
  constexpr int C = LPR * 4;
  const int64_t tiles = (a.dv + C - 1) / C;
  const int64_t blocks = a.B * a.Hv * tiles;
  LOOM_CHECK_GRID(blocks);
  const size_t smem = sizeof(float) * static_cast<size_t>(a.dk) * (C + 3);
  if (smem > 48 * 1024) {
    static std::atomic<uint64_t> smem_done{0};
    allow_smem(kda_decode_smem_kernel<In, LPR, WARPS>, sizeof(float) * kMaxDk * (C + 3), smem_done);
  }
  LOOM_MARK_PDL_KERNEL((kda_decode_smem_kernel<In, LPR, WARPS>));
  kda_decode_smem_kernel<In, LPR, WARPS>
      <<<static_cast<unsigned>(blocks), WARPS * 32, smem, stream>>>(
          a.q, a.k, a.v, a.g, a.beta, a.beta_bf16, a.scale, a.pool, a.slots, a.out, a.Hk, a.Hv,
          a.dk, a.dv, a.num_slots, static_cast<int>(tiles), a.scalar_g);
  return true;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

// The launch of either activation type (In = float or bf16).
template <class In>
void decode_batched(cudaStream_t stream, const In* q, const In* k, const In* v, const float* g,
                    const void* beta, bool beta_bf16, float scale, float* state_pool,
                    const int32_t* state_slots, In* out, int64_t B, int64_t num_slots, int64_t Hk,
                    int64_t Hv, int64_t dk, int64_t dv, bool scalar_g, int layout) {
  if (B == 0 || Hv == 0 || dv == 0) return;
  if (dk > kMaxDk || Hv > 65535 || dv > (int64_t{1} << 24)) {
    std::fprintf(stderr, "kda_decode_batched (CUDA): dk %lld > %d, Hv %lld or dv %lld too large\n",
                 static_cast<long long>(dk), kMaxDk, static_cast<long long>(Hv),
                 static_cast<long long>(dv));
    std::abort();
  }
  const Args<In> a{q,
                   k,
                   v,
                   g,
                   beta,
                   beta_bf16,
                   scale,
                   state_pool,
                   state_slots,
                   out,
                   static_cast<int>(Hk),
                   static_cast<int>(Hv),
                   static_cast<int>(dk),
                   static_cast<int>(dv),
                   num_slots,
                   B,
                   scalar_g};
  // Vector access needs every state row, v row and out row 16-byte aligned.
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool vec = dv % 4 == 0 && aligned(state_pool) && aligned(v) && aligned(out);
  if (layout == 0) {
    if (!vec) {
      layout = 6;
    } else {
      layout = launch::kda_decode_auto_layout(B, Hv, dv);
    }
  }
  if (!vec && layout != 6) {
    std::fprintf(stderr, "kda_decode_batched (CUDA): layout %d needs dv %% 4 == 0, aligned\n",
                 layout);
    std::abort();
  }
  bool ok = false;
  switch (layout) {
    case 1:
      ok = launch_smem_layout<In, 4, 4>(stream, a);
      break;
    case 2:
      ok = launch_smem_layout<In, 8, 4>(stream, a);
      break;
    case 3:
      ok = launch_smem_layout<In, 16, 8>(stream, a);
      break;
    case 4:
      ok = launch_smem_layout<In, 16, 4>(stream, a);
      break;
    case 5:
      ok = launch_smem_layout<In, 32, 8>(stream, a);
      break;
    case 6:
      ok = launch_layout<In, 1, 32, 8>(stream, a);
      break;
    case 7:
      ok = launch_layout<In, 4, 8, 4>(stream, a);
      break;
    default:
      break;
  }
  if (!ok) {
    std::fprintf(stderr, "kda_decode_batched (CUDA): layout %d does not fit dk %lld\n", layout,
                 static_cast<long long>(dk));
    std::abort();
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

int kda_decode_auto_layout(int64_t B, int64_t Hv, int64_t dv) {
  // Enough 64-column tiles to give every SM several: the widest tile that measured best at
  // B >= 64 (256-byte row segments, 8 warps). Fewer heads (B = 1: 64 such blocks for 132
  // SMs): 16-column tiles, 4x the blocks, so the whole state is requested at once.
  const int64_t blocks64 = B * Hv * ((dv + 63) / 64);
  return blocks64 >= 4 * sm_count() ? 3 : 1;
}

void kda_decode_batched(cudaStream_t stream, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, float scale, float* state_pool,
                        const int32_t* state_slots, float* out, int64_t B, int64_t num_slots,
                        int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, bool scalar_g, int layout) {
  decode_batched<float>(stream, q, k, v, g, beta, false, scale, state_pool, state_slots, out, B,
                        num_slots, Hk, Hv, dk, dv, scalar_g, layout);
}

void kda_decode_batched_bf16(cudaStream_t stream, const void* q, const void* k, const void* v,
                             const float* g, const void* beta, bool beta_bf16, float scale,
                             float* state_pool, const int32_t* state_slots, void* out, int64_t B,
                             int64_t num_slots, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv,
                             bool scalar_g, int layout) {
  decode_batched<bf16>(stream, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                       static_cast<const bf16*>(v), g, beta, beta_bf16, scale, state_pool,
                       state_slots, static_cast<bf16*>(out), B, num_slots, Hk, Hv, dk, dv, scalar_g,
                       layout);
}

}  // namespace launch
}  // namespace loom::cuda
