// The scheduling, combining and MLA projection kernels of the varlen attention ops
// (kernels/cuda/attention.cc drives them; the attention passes themselves are in
// attention_simt.cu and attention_mla_tc.cu).
//
// Schedule (attn_schedule_kernel, one block). The host knows only shapes, so the split of a call
// into work items is made on the device from cu_seqlens and past_lens: per sequence (phase 1, a
// block-wide scan over sequences) how many items, partial slots and split rows it needs; per row
// (phase 2, in parallel) its split count, partial slot, place in the split-row list and, for the
// first row of an item, the item itself. Every count is a function of that sequence's own lengths
// (keys_per_split in attention_launch.h), so a row is computed the same way alone or in any batch.
//
// Row invariance of the projections. Every output element of mla_absorb_q and mla_project_out is
// one dot product summed in a fixed order (sequentially over the reduced index, or per lane then
// an xor-shuffle tree), whatever the number of rows or how they are tiled; the combine of split
// partials runs over the splits in order. The engine's batch-invariant mode relies on this.
#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float load_act(const void* p, int64_t i, bool is_bf16) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i])
                 : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_act(void* p, int64_t i, float x, bool is_bf16) {
  if (is_bf16) {
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<float*>(p)[i] = x;
  }
}

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- schedule -------------------------------------------------------------------------------

constexpr int kSchedThreads = 1024;
constexpr int kSchedCachedCu = 2048;  // cu_seqlens cached in shared memory up to this many + 1
// choose_chunk weighs a candidate split per thread up to this many sequences, else per warp.
constexpr int kSchedThreadPerCandidate = 32;

// Inclusive scan of three counters over the block (kSchedThreads threads). `warp_tot` holds
// 3 x 32 ints. Contains __syncthreads.
__device__ __forceinline__ void block_scan3(int32_t (&v)[3], int32_t (*warp_tot)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, v[k], o);
      if (lane >= o) v[k] += y;
    }
  }
  __syncthreads();
  if (lane == 31) {
#pragma unroll
    for (int k = 0; k < 3; ++k) warp_tot[k][warp] = v[k];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      int32_t t = warp_tot[k][lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(0xffffffffu, t, o);
        if (lane >= o) t += y;
      }
      warp_tot[k][lane] = t;  // inclusive over warps
    }
  }
  __syncthreads();
  if (warp > 0) {
#pragma unroll
    for (int k = 0; k < 3; ++k) v[k] += warp_tot[k][warp - 1];
  }
}

__device__ __forceinline__ int64_t policy_chunk(const launch::AttnPolicy& p, int64_t T, int64_t L) {
  if (p.split_rows <= 0 || T <= 0 || T > p.split_rows) return 0;
  return launch::keys_per_split(p, L);
}

__device__ __forceinline__ uint32_t cdiv32(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// The occupancy-aware choice of min_chunk for a call (policy.wave_items > 0): candidate k splits
// the longest splittable sequence (Lmax keys) into k + 1 chunks, c_k = max(floor,
// ceil(Lmax / (k + 1)) rounded up to the key tile), and every other sequence by the same
// min_chunk. Its estimated time, in keys of one persistent block's traffic:
//   ceil(U / W) * (u + unit_keys) + part_keys * P / W
// U: items; W: items that run at once; u: the longest split sequence's chunk (the longest item
// of a wave); P: partial slots (each written and read back once). The least estimate wins,
// ties to fewer splits; a candidate needing more than max_parts slots is out (k = 0 never
// splits, so one always fits). Warp w weighs candidates w, w + 32, ...; lanes the sequences.
// 32-bit arithmetic: the host refuses contexts of 2^31 keys. Contains __syncthreads.
__device__ int64_t choose_chunk(const launch::AttnPolicy& p, const int64_t* cuv, const int64_t* pv,
                                int64_t B, int64_t* est_s, int64_t* red_s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t srows = static_cast<uint32_t>(p.split_rows);
  // Sequence b's new rows T and its last row's visible keys (the host bounds both below 2^31).
  auto length = [&](int64_t b, uint32_t& T) {
    const int64_t t = cuv[b + 1] - cuv[b];
    T = static_cast<uint32_t>(t < 0 ? 0 : (t > INT32_MAX ? INT32_MAX : t));
    const int64_t L = pv[b] + t;
    return static_cast<uint32_t>(L < 0 ? 0 : (L > INT32_MAX ? INT32_MAX : L));
  };
  uint32_t lmax = 0;
  for (int64_t b = tid; b < B; b += kSchedThreads) {
    uint32_t T;
    const uint32_t L = length(b, T);
    if (T >= 1 && T <= srows) lmax = max(lmax, L);
  }
  for (int o = 16; o > 0; o >>= 1) lmax = max(lmax, __shfl_xor_sync(0xffffffffu, lmax, o));
  if (lane == 0) red_s[warp] = lmax;
  __syncthreads();
  lmax = 0;
  for (int w = 0; w < kSchedThreads / 32; ++w) lmax = max(lmax, static_cast<uint32_t>(red_s[w]));
  const uint32_t kb = static_cast<uint32_t>(p.key_block),
                 floor = static_cast<uint32_t>(p.min_chunk);
  if (lmax <= floor) return p.min_chunk;  // nothing splits anyway
  const int nc = static_cast<int>(min(static_cast<uint32_t>(p.max_splits), cdiv32(lmax, floor)));
  const uint32_t rpi = static_cast<uint32_t>(p.rows_per_item);
  const uint32_t msplits = static_cast<uint32_t>(p.max_splits);
  const int64_t W = p.wave_items;
  const auto candidate = [&](int k) { return max(floor, cdiv32(cdiv32(lmax, k + 1), kb) * kb); };
  // Candidate chunk c's items, partial slots and longest unit over sequences b0, b0 + step, ...
  struct Tally {
    uint32_t items = 0, parts = 0, umax = 0;
  };
  const auto tally = [&](uint32_t c, int64_t b0, int64_t step) {
    Tally y;
    for (int64_t b = b0; b < B; b += step) {
      uint32_t T;
      const uint32_t L = length(b, T);
      if (T == 0) continue;
      if (T > srows) {  // never splits: a unit per row tile
        y.items += cdiv32(T, rpi);
        continue;
      }
      // keys_per_split with min_chunk = c, in 32 bits.
      uint32_t n = min(cdiv32(L, c), msplits), chunk = 0;
      if (n > 1) chunk = cdiv32(cdiv32(L, n), kb) * kb;
      if (chunk == 0) {
        y.items += cdiv32(T, rpi);
        y.umax = max(y.umax, L);
        continue;
      }
      y.umax = max(y.umax, chunk);
      const uint32_t P = L - T;
      for (uint32_t t0 = 0; t0 < T; t0 += rpi) y.items += cdiv32(P + min(T, t0 + rpi), chunk);
      for (uint32_t i = 0; i < T; ++i) {
        const uint32_t ns = cdiv32(P + i + 1, chunk);
        if (ns > 1) y.parts += ns;
      }
    }
    return y;
  };
  const int64_t max_parts = p.max_parts, unit_keys = p.unit_keys, part_keys = p.part_keys;
  const auto estimate = [&](const Tally& y) {
    const bool fits = max_parts <= 0 || y.parts <= static_cast<uint64_t>(max_parts);
    return fits ? (static_cast<int64_t>(y.items) + W - 1) / W * (y.umax + unit_keys) +
                      part_keys * y.parts / W
                : INT64_MAX;
  };
  if (B <= kSchedThreadPerCandidate) {
    // Few sequences (decode at a small batch): a thread per candidate, every candidate at once.
    // A warp per candidate left each warp a chain of nc / 32 candidates with their shuffle
    // reductions: on an H200 the schedule of a batch-1 call over 128K keys took 6 us longer
    // (19.9 against 13.9 us, eager).
    for (int k = tid; k < nc; k += kSchedThreads) est_s[k] = estimate(tally(candidate(k), 0, 1));
  } else {
    // Many sequences: a warp per candidate, lanes over the sequences (integer sums: the order
    // does not matter).
    for (int k = warp; k < nc; k += kSchedThreads / 32) {
      Tally y = tally(candidate(k), lane, 32);
      for (int o = 16; o > 0; o >>= 1) {
        y.items += __shfl_xor_sync(0xffffffffu, y.items, o);
        y.parts += __shfl_xor_sync(0xffffffffu, y.parts, o);
        y.umax = max(y.umax, __shfl_xor_sync(0xffffffffu, y.umax, o));
      }
      if (lane == 0) est_s[k] = estimate(y);
    }
  }
  __syncthreads();
  // The first least estimate, by warp 0: each lane its candidates in order, then a shuffle tree
  // (ties to the lower k), instead of one thread walking all of them (a chain of dependent
  // shared-memory loads; 2.7 us of a 128K-key batch-1 call on an H200).
  if (warp == 0) {
    int64_t be = INT64_MAX;
    int bk = INT_MAX;
    for (int k = lane; k < nc; k += 32) {
      const int64_t e = est_s[k];
      if (e < be) {
        be = e;
        bk = k;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const int64_t oe = __shfl_xor_sync(0xffffffffu, be, o);
      const int ok = __shfl_xor_sync(0xffffffffu, bk, o);
      if (oe < be || (oe == be && ok < bk)) {
        be = oe;
        bk = ok;
      }
    }
    if (lane == 0) red_s[0] = candidate(bk);
  }
  __syncthreads();
  const int64_t chosen = red_s[0];
  __syncthreads();  // red_s is read by every thread before anyone reuses it
  return chosen;
}

__global__ void __launch_bounds__(kSchedThreads)
    attn_schedule_kernel(launch::AttnPolicy p, const int64_t* __restrict__ cu,
                         const int64_t* __restrict__ past, int64_t N, int64_t B,
                         const launch::AttnSchedule s) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  __shared__ int32_t warp_tot[3][32];
  __shared__ int32_t carry[3];
  __shared__ int64_t cu_s[kSchedCachedCu + 1];
  __shared__ int64_t past_s[kSchedCachedCu];
  __shared__ int64_t est_s[256], red_s[kSchedThreads / 32];
  const int tid = threadIdx.x;
  const bool cached = B <= kSchedCachedCu;
  if (cached) {
    for (int64_t b = tid; b <= B; b += kSchedThreads) cu_s[b] = cu[b];
    if (p.wave_items > 0)
      for (int64_t b = tid; b < B; b += kSchedThreads) past_s[b] = past[b];
  }
  if (tid < 3) carry[tid] = 0;
  __syncthreads();
  const int64_t* cuv = cached ? cu_s : cu;
  if (p.wave_items > 0 && p.split_rows > 0)
    p.min_chunk = static_cast<int>(choose_chunk(p, cuv, cached ? past_s : past, B, est_s, red_s));
  const int64_t rpi = p.rows_per_item;

  // Phase 1: per sequence, its item, part and split-row counts; exclusive offsets by scan.
  for (int64_t base = 0; base < B; base += kSchedThreads) {
    const int64_t b = base + tid;
    int32_t v[3] = {0, 0, 0};
    if (b < B) {
      const int64_t T = cuv[b + 1] - cuv[b], P = past[b];
      const int64_t chunk = policy_chunk(p, T, P + T);
      const int64_t tiles = ceil_div(T, rpi);
      if (chunk == 0) {
        v[0] = static_cast<int32_t>(tiles);
      } else {
        for (int64_t t = 0; t < tiles; ++t)
          v[0] += static_cast<int32_t>(ceil_div(P + min(T, (t + 1) * rpi), chunk));
        for (int64_t i = 0; i < T; ++i) {
          const int64_t ns = ceil_div(P + i + 1, chunk);
          if (ns > 1) {
            v[1] += static_cast<int32_t>(ns);
            v[2] += 1;
          }
        }
      }
      s.seq_chunk[b] = static_cast<int32_t>(chunk);
    }
    const int32_t own[3] = {v[0], v[1], v[2]};
    block_scan3(v, warp_tot);
    if (b < B) {
      s.seq_off[3 * b + 0] = carry[0] + v[0] - own[0];
      s.seq_off[3 * b + 1] = carry[1] + v[1] - own[1];
      s.seq_off[3 * b + 2] = carry[2] + v[2] - own[2];
    }
    __syncthreads();  // every thread has read carry
    if (tid == kSchedThreads - 1) {
      carry[0] += v[0];
      carry[1] += v[1];
      carry[2] += v[2];
    }
    __syncthreads();
  }
  if (tid == 0) {
    s.counts[0] = carry[0];
    s.counts[1] = carry[2];
  }
  __syncthreads();  // seq_off and seq_chunk (global, this block's writes) visible below

  // Phase 2: per row, its splits and slots; the first row of an item writes the item.
  for (int64_t r = tid; r < N; r += kSchedThreads) {
    // The sequence of row r: the last b with cu[b] <= r (empty sequences before it share cu[b]).
    int64_t lo = 0, hi = B - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) >> 1;
      if (cuv[mid] <= r) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int64_t b = lo;
    const int64_t i = r - cuv[b], T = cuv[b + 1] - cuv[b], P = past[b];
    const int64_t chunk = s.seq_chunk[b];
    const int32_t* off = s.seq_off + 3 * b;
    const int64_t ns = chunk == 0 ? 1 : ceil_div(P + i + 1, chunk);
    s.row_nsplit[r] = static_cast<int32_t>(ns);
    if (ns > 1) {
      int64_t part = off[1], idx = off[2];
      for (int64_t i2 = 0; i2 < i; ++i2) {
        const int64_t n2 = ceil_div(P + i2 + 1, chunk);
        if (n2 > 1) {
          part += n2;
          idx += 1;
        }
      }
      s.row_part[r] = static_cast<int32_t>(part);
      s.split_row_list[idx] = static_cast<int32_t>(r);
    } else {
      s.row_part[r] = -1;
    }
    if (i % rpi == 0) {
      const int64_t tile = i / rpi, nrows = min(rpi, T - i);
      int64_t idx = off[0];
      int64_t nsp = 1;
      if (chunk == 0) {
        idx += tile;
      } else {
        for (int64_t t2 = 0; t2 < tile; ++t2) idx += ceil_div(P + min(T, (t2 + 1) * rpi), chunk);
        nsp = ceil_div(P + i + nrows, chunk);
      }
      for (int64_t sp = 0; sp < nsp; ++sp) {
        int4 item;
        item.x = static_cast<int>(b);
        item.y = static_cast<int>(r);
        item.z = static_cast<int>(nrows);
        item.w = static_cast<int>(sp);
        reinterpret_cast<int4*>(s.items)[idx + sp] = item;
      }
    }
  }
}

// ---- combine ---------------------------------------------------------------------------------

constexpr int kCombineThreads = 256;  // also the most splits a row may have

// The weights of split row r's partials for head h, in shared memory: w[s] = 2^(m_s - M) with
// M = max_s m_s; returns their l-weighted sum (the softmax denominator), summed in split order.
// Every thread of the block must call it (barriers); ns <= kCombineThreads.
__device__ __forceinline__ float split_weights(const float* __restrict__ part_ml, int64_t p0,
                                               int ns, int H, int h, float* w, float* lw) {
  __syncthreads();  // w and lw may still be read for the previous row
  if (threadIdx.x < ns) w[threadIdx.x] = part_ml[((p0 + threadIdx.x) * H + h) * 2];
  __syncthreads();
  float M = -INFINITY;
  for (int sp = 0; sp < ns; ++sp) M = fmaxf(M, w[sp]);
  __syncthreads();
  if (threadIdx.x < ns) {
    const float e = exp2f(w[threadIdx.x] - M);
    w[threadIdx.x] = e;
    lw[threadIdx.x] = e * part_ml[((p0 + threadIdx.x) * H + h) * 2 + 1];
  }
  __syncthreads();
  float den = 0.0f;
  for (int sp = 0; sp < ns; ++sp) den += lw[sp];
  return den;
}

// Block (split row, head, slice of `cols` columns): the row's output columns from its partials.
// With cols < kCombineThreads the threads form kCombineThreads / cols groups: group g sums the
// splits g, g + groups, ... in order, then group 0 adds the groups' sums in group order (cols
// and so the order follow from host-known sizes alone: the same for every replay of a graph).
__global__ void __launch_bounds__(kCombineThreads)
    attn_combine_kernel(const launch::AttnArgs a, int cols) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  __shared__ float w[kCombineThreads], lw[kCombineThreads], red[kCombineThreads];
  const int32_t count = a.sched.counts[1];
  const int H = a.heads, dv = a.dv, h = blockIdx.y;
  const int groups = kCombineThreads / cols, cl = threadIdx.x % cols, g = threadIdx.x / cols;
  for (int32_t idx = blockIdx.x; idx < count; idx += gridDim.x) {
    const int64_t r = a.sched.split_row_list[idx];
    const int ns = a.sched.row_nsplit[r];
    const int64_t p0 = a.sched.row_part[r];
    const float den = split_weights(a.part_ml, p0, ns, H, h, w, lw);
    for (int c0 = blockIdx.z * cols; c0 < dv; c0 += gridDim.z * cols) {
      const int c = c0 + cl;
      float num = 0.0f;
      if (c < dv) {
#pragma unroll 16  // independent loads in flight; the sum stays in split order
        for (int sp = g; sp < ns; sp += groups)
          num = fmaf(w[sp], a.part_acc[((p0 + sp) * H + h) * dv + c], num);
      }
      if (groups == 1) {
        if (c < dv) store_act(a.o, r * a.o_row + h * a.o_head + c, num / den, a.o_bf16);
        continue;
      }
      red[threadIdx.x] = num;
      __syncthreads();
      if (g == 0 && c < dv) {
        float sum = red[cl];
        for (int k = 1; k < groups; ++k) sum += red[k * cols + cl];
        store_act(a.o, r * a.o_row + h * a.o_head + c, sum / den, a.o_bf16);
      }
      __syncthreads();  // red is rewritten by the next slice
    }
  }
}

// ---- MLA projections ------------------------------------------------------------------------

constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbWarps = kAbsorbThreads / 32;

// q_lat[t, h, r] = sum_d q[t, h, d] W[h * (dn + dv) + d, r], r < R; then the rope part copied.
// Block: TM rows x 32 columns (lane = column) of one head. Warp w sums its eighth of the d range
// in order (its loads all independent, so a block has 8 x 32 x dn / 8 loads in flight even for
// one row), then the eight partial sums are added in warp order. q rows are staged transposed
// ([dn][TM]) so a column's TM products read TM / 4 float4 per step.
template <int TM>
__global__ void __launch_bounds__(kAbsorbThreads)
    mla_absorb_q_kernel(const void* __restrict__ q, bool act_bf16, const float* __restrict__ kv_b,
                        float* __restrict__ q_lat, int64_t N, int H, int dn, int dr, int dv,
                        int R) {
  dev::pdl_wait();                             // PDL-aware (kernels/cuda/pdl.h): before any access
  extern __shared__ __align__(16) float qs[];  // [dn][TM], then [kAbsorbWarps][TM][32]
  float* red = qs + dn * TM;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * TM;
  const int h = blockIdx.y;
  const int dq = dn + dr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < TM * dn; e += kAbsorbThreads) {
    const int tt = e / dn, d = e % dn;
    const int64_t t = t0 + tt;
    qs[d * TM + tt] = t < N ? load_act(q, (t * H + h) * dq + d, act_bf16) : 0.0f;
  }
  __syncthreads();
  const int r = blockIdx.z * 32 + lane;
  const int per = (dn + kAbsorbWarps - 1) / kAbsorbWarps;
  const int d0 = warp * per, d1 = min(dn, d0 + per);
  float acc[TM];
#pragma unroll
  for (int tt = 0; tt < TM; ++tt) acc[tt] = 0.0f;
  if (r < R) {
    const float* w = kv_b + static_cast<int64_t>(h) * (dn + dv) * R + r;
#pragma unroll 8
    for (int d = d0; d < d1; ++d) {
      const float wd = w[static_cast<int64_t>(d) * R];
      const float4* qd = reinterpret_cast<const float4*>(qs + d * TM);
#pragma unroll
      for (int k = 0; k < TM / 4; ++k) {
        const float4 x = qd[k];
        acc[4 * k + 0] = fmaf(x.x, wd, acc[4 * k + 0]);
        acc[4 * k + 1] = fmaf(x.y, wd, acc[4 * k + 1]);
        acc[4 * k + 2] = fmaf(x.z, wd, acc[4 * k + 2]);
        acc[4 * k + 3] = fmaf(x.w, wd, acc[4 * k + 3]);
      }
    }
  }
#pragma unroll
  for (int tt = 0; tt < TM; ++tt) red[(warp * TM + tt) * 32 + lane] = acc[tt];
  __syncthreads();
  for (int e = threadIdx.x; e < TM * 32; e += kAbsorbThreads) {
    const int tt = e / 32, c = e % 32;
    const int64_t t = t0 + tt;
    const int rc = blockIdx.z * 32 + c;
    if (t >= N || rc >= R) continue;
    float sum = red[tt * 32 + c];
    for (int w = 1; w < kAbsorbWarps; ++w) sum += red[(w * TM + tt) * 32 + c];
    q_lat[(t * H + h) * (R + dr) + rc] = sum;
  }
  if (blockIdx.z == 0) {
    for (int e = threadIdx.x; e < TM * dr; e += kAbsorbThreads) {
      const int tt = e / dr, j = e % dr;
      const int64_t t = t0 + tt;
      if (t < N)
        q_lat[(t * H + h) * (R + dr) + R + j] = load_act(q, (t * H + h) * dq + dn + j, act_bf16);
    }
  }
}

constexpr int kProjectThreads = 256;

// out[t, h, v] = sum_k o_lat[t, h, k] W[h * (dn + dv) + dn + v, k]: a warp per v, lanes over k
// (four consecutive k per lane and step when R % 4 == 0), then an xor-shuffle sum. The block's TM
// rows of o_lat are staged first, combined from their partials for split rows (part_acc null:
// o_lat holds every row combined already).
template <int TM>
__global__ void __launch_bounds__(kProjectThreads)
    mla_project_out_kernel(const float* __restrict__ o_lat, const float* __restrict__ part_acc,
                           const float* __restrict__ part_ml, const launch::AttnSchedule sched,
                           const float* __restrict__ kv_b, void* __restrict__ out, bool act_bf16,
                           int64_t N, int H, int dn, int dv, int R, int v_tile) {
  dev::pdl_wait();                             // PDL-aware (kernels/cuda/pdl.h): before any access
  extern __shared__ __align__(16) float os[];  // [TM][R]
  __shared__ float w[kCombineThreads], lw[kCombineThreads];
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * TM;
  const int h = blockIdx.y;
  for (int tt = 0; tt < TM; ++tt) {
    const int64_t t = t0 + tt;
    float* dst = os + tt * R;
    if (t >= N) {
      for (int k = threadIdx.x; k < R; k += kProjectThreads) dst[k] = 0.0f;
      continue;
    }
    const int ns = part_acc == nullptr ? 1 : sched.row_nsplit[t];
    if (ns <= 1) {
      const float* src = o_lat + (t * H + h) * R;
      for (int k = threadIdx.x; k < R; k += kProjectThreads) dst[k] = src[k];
      continue;
    }
    const int64_t p0 = sched.row_part[t];
    const float den = split_weights(part_ml, p0, ns, H, h, w, lw);
    for (int k = threadIdx.x; k < R; k += kProjectThreads) {
      float num = 0.0f;
#pragma unroll 16  // independent loads in flight; the sum stays in split order
      for (int sp = 0; sp < ns; ++sp) num = fmaf(w[sp], part_acc[((p0 + sp) * H + h) * R + k], num);
      dst[k] = num / den;
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int v0 = blockIdx.z * v_tile, v1 = min(dv, v0 + v_tile);
  for (int v = v0 + warp; v < v1; v += kProjectThreads / 32) {
    const float* w = kv_b + (static_cast<int64_t>(h) * (dn + dv) + dn + v) * R;
    float acc[TM];
#pragma unroll
    for (int tt = 0; tt < TM; ++tt) acc[tt] = 0.0f;
    if (R % 4 == 0) {
      for (int k = 4 * lane; k < R; k += 128) {
        const float4 wk = *reinterpret_cast<const float4*>(w + k);
#pragma unroll
        for (int tt = 0; tt < TM; ++tt) {
          const float4 x = *reinterpret_cast<const float4*>(os + tt * R + k);
          float a = acc[tt];
          a = fmaf(x.x, wk.x, a);
          a = fmaf(x.y, wk.y, a);
          a = fmaf(x.z, wk.z, a);
          acc[tt] = fmaf(x.w, wk.w, a);
        }
      }
    } else {
      for (int k = lane; k < R; k += 32) {
        const float wk = w[k];
#pragma unroll
        for (int tt = 0; tt < TM; ++tt) acc[tt] = fmaf(os[tt * R + k], wk, acc[tt]);
      }
    }
#pragma unroll
    for (int tt = 0; tt < TM; ++tt) acc[tt] = dev::warp_sum(acc[tt]);
    if (lane == 0) {
#pragma unroll
      for (int tt = 0; tt < TM; ++tt) {
        const int64_t t = t0 + tt;
        if (t < N) store_act(out, (t * H + h) * dv + v, acc[tt], act_bf16);
      }
    }
  }
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

namespace launch {

int64_t resident_blocks(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  // (device, kernel, smem) -> resident blocks; (device, kernel) -> the shared-memory limit set.
  static std::vector<std::tuple<int, const void*, size_t, int64_t>> seen;
  static std::vector<std::tuple<int, const void*, size_t>> limits;
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, k, b, n] : seen)
    if (d == dev && k == kernel && b == smem) return n;
  // The limit only ever rises, so every smem seen before stays launchable.
  bool raised = false;
  for (auto& [d, k, b] : limits) {
    if (d != dev || k != kernel) continue;
    raised = true;
    if (smem > b) {
      LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
      b = smem;
    }
  }
  if (!raised) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    limits.emplace_back(dev, kernel, smem);
  }
  int per_sm = 0, sms = 0;
  LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t n = static_cast<int64_t>(per_sm < 1 ? 1 : per_sm) * sms;
  seen.emplace_back(dev, kernel, smem, n);
  return n;
}

AttnBounds attn_bounds(const AttnPolicy& p, int64_t N, int64_t B, int64_t max_context) {
  AttnBounds b;
  const int64_t seqs = B < N ? B : N;  // sequences with rows
  const int64_t tiles = (N + p.rows_per_item - 1) / p.rows_per_item + seqs;
  int64_t max_splits = 1;
  if (p.split_rows > 0) {
    max_splits = (max_context + p.min_chunk - 1) / p.min_chunk;
    if (max_splits > p.max_splits) max_splits = p.max_splits;
    if (max_splits < 1) max_splits = 1;
  }
  if (max_splits <= 1) {
    b.items = tiles;
    return b;
  }
  const int64_t rows = N < B * p.split_rows ? N : B * p.split_rows;
  int64_t split_tiles = seqs * ((p.split_rows + p.rows_per_item - 1) / p.rows_per_item);
  if (split_tiles > tiles) split_tiles = tiles;
  b.items = tiles + split_tiles * (max_splits - 1);
  b.split_rows = rows;
  b.parts = rows * max_splits;
  if (p.wave_items > 0 && p.max_parts > 0 && b.parts > p.max_parts) b.parts = p.max_parts;
  return b;
}

size_t attn_schedule_bytes(const AttnBounds& bounds, int64_t N, int64_t B) {
  return align256(2 * 4) + align256(static_cast<size_t>(bounds.items) * 16) +
         align256(static_cast<size_t>(B) * 4) + align256(static_cast<size_t>(B) * 12) +
         2 * align256(static_cast<size_t>(N) * 4) +
         align256(static_cast<size_t>(bounds.split_rows) * 4);
}

AttnSchedule attn_schedule_carve(void* buffer, const AttnBounds& bounds, int64_t N, int64_t B) {
  char* p = static_cast<char*>(buffer);
  auto take = [&](size_t bytes) {
    int32_t* r = reinterpret_cast<int32_t*>(p);
    p += align256(bytes);
    return r;
  };
  AttnSchedule s;
  s.counts = take(2 * 4);
  s.items = take(static_cast<size_t>(bounds.items) * 16);
  s.seq_chunk = take(static_cast<size_t>(B) * 4);
  s.seq_off = take(static_cast<size_t>(B) * 12);
  s.row_nsplit = take(static_cast<size_t>(N) * 4);
  s.row_part = take(static_cast<size_t>(N) * 4);
  s.split_row_list = take(static_cast<size_t>(bounds.split_rows) * 4);
  return s;
}

void attn_schedule(cudaStream_t stream, const AttnPolicy& policy, const int64_t* cu,
                   const int64_t* past, int64_t N, int64_t B, const AttnSchedule& s) {
  LOOM_MARK_PDL_KERNEL(attn_schedule_kernel);
  attn_schedule_kernel<<<1, kSchedThreads, 0, stream>>>(policy, cu, past, N, B, s);
  LOOM_CUDA_CHECK_LAUNCH();
}

void attn_combine(cudaStream_t stream, const AttnArgs& a, int64_t max_split_rows, bool spread) {
  if (max_split_rows <= 0) return;
  const int64_t rows = max_split_rows < 65536 ? max_split_rows : 65536;
  // Enough blocks to keep every multiprocessor's loads in flight when few rows split (a batch
  // of 1 at 128K keys: 32 (row, head) blocks would read its 8 MB of partials at ~0.4 TB/s).
  constexpr int64_t kWantBlocks = 512;
  int cols = kCombineThreads;
  while (spread && cols > 32 && rows * a.heads * ((a.dv + cols - 1) / cols) < kWantBlocks)
    cols /= 2;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>((a.dv + cols - 1) / cols));
  LOOM_MARK_PDL_KERNEL(attn_combine_kernel);
  attn_combine_kernel<<<grid, kCombineThreads, 0, stream>>>(a, cols);
  LOOM_CUDA_CHECK_LAUNCH();
}

void mla_absorb_q(cudaStream_t stream, const void* q, bool act_bf16, const float* kv_b,
                  float* q_lat, int64_t N, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                  int64_t R) {
  if (N == 0) return;
  const unsigned cols = static_cast<unsigned>((R + 31) / 32);
  auto go = [&](auto tm) {
    constexpr int TM = decltype(tm)::value;
    const size_t smem = (static_cast<size_t>(TM) * dn + kAbsorbWarps * TM * 32) * sizeof(float);
    if (smem > 48 * 1024)
      LOOM_CUDA_CHECK(cudaFuncSetAttribute(mla_absorb_q_kernel<TM>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    const int64_t row_blocks = (N + TM - 1) / TM;
    LOOM_CHECK_GRID(row_blocks);
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(H), cols);
    LOOM_MARK_PDL_KERNEL(mla_absorb_q_kernel<TM>);
    mla_absorb_q_kernel<TM><<<grid, kAbsorbThreads, smem, stream>>>(
        q, act_bf16, kv_b, q_lat, N, static_cast<int>(H), static_cast<int>(dn),
        static_cast<int>(dr), static_cast<int>(dv), static_cast<int>(R));
    LOOM_CUDA_CHECK_LAUNCH();
  };
  // 32 staged rows need 128 dn bytes of shared memory: 8 rows past dn = 1024.
  if (N <= 64 || dn > 1024) {
    go(std::integral_constant<int, 8>{});
  } else {
    go(std::integral_constant<int, 32>{});
  }
}

void mla_project_out(cudaStream_t stream, const float* o_lat, const float* part_acc,
                     const float* part_ml, const AttnSchedule& sched, const float* kv_b, void* out,
                     bool act_bf16, int64_t N, int64_t H, int64_t dn, int64_t dv, int64_t R) {
  if (N == 0) return;
  auto go = [&](auto tm) {
    constexpr int TM = decltype(tm)::value;
    const size_t smem = static_cast<size_t>(TM) * R * sizeof(float);
    if (smem > 48 * 1024)
      LOOM_CUDA_CHECK(cudaFuncSetAttribute(mla_project_out_kernel<TM>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    // Few rows: more blocks per head, each a slice of the value dims (the staged rows are
    // recomputed per slice; the products are the same).
    const int v_tile = N <= 16 ? 32 : static_cast<int>(dv);
    const int64_t row_blocks = (N + TM - 1) / TM;
    LOOM_CHECK_GRID(row_blocks);
    const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(H),
                    static_cast<unsigned>((dv + v_tile - 1) / v_tile));
    LOOM_MARK_PDL_KERNEL(mla_project_out_kernel<TM>);
    mla_project_out_kernel<TM><<<grid, kProjectThreads, smem, stream>>>(
        o_lat, part_acc, part_ml, sched, kv_b, out, act_bf16, N, static_cast<int>(H),
        static_cast<int>(dn), static_cast<int>(dv), static_cast<int>(R), v_tile);
    LOOM_CUDA_CHECK_LAUNCH();
  };
  // 32 staged rows need 128 R bytes of shared memory: 8 rows past 1600 latent dims.
  if (N <= 64 || R > 1600) {
    go(std::integral_constant<int, 8>{});
  } else {
    go(std::integral_constant<int, 32>{});
  }
}

}  // namespace launch
}  // namespace loom::cuda
