// MoE routing, permutation and combination on the GPU (the grouped SwiGLU is in moe_gemm.cu).
//
// moe_route: one warp per token. The scores are computed as the CPU twin computes them, so that
// the selection and the weights are the same bits: exp is evaluated in double and rounded once to
// f32 (correctly rounded but for ~2^-29 of inputs, like glibc's expf that the CPU calls), the
// softmax sum runs sequentially in expert order in one lane, the group score is the sum of the
// group's two largest selection scores found in expert order, and each top-k pick is an argmax
// over the not yet picked experts that breaks ties towards the lower index (the CPU's
// partial_sort comparator orders the same way). The renormalisation sums the picked scores in
// pick order, then divides and scales as the CPU does.
//
// moe_route_replay: one warp per row recomputes the replayed experts' weights from the logits with
// moe_route's arithmetic (so a row's own experts replayed give its own bits) and counts the slots
// outside the row's own top-k.
//
// moe_permute: a stable counting sort of the slots by owned expert. Up to 8192 slots, one block
// of 32 warps ranks them all: warp w owns the w-th of 32 contiguous segments of the slots. Pass 1
// counts each segment's slots per owned expert (lanes of one expert found with
// __match_any_sync, their count added by the lowest); the block turns the counts into offsets
// and each segment's first row per expert; pass 2 walks the segments again in slot order, each
// slot taking its segment's next row of its expert. More slots are cut into chunks of 2048 (8
// warps of 256) and ranked the same way in three launches: per-chunk counts, one block scanning
// them (offsets, each chunk's first row per expert), then per chunk the warps' first rows and the
// slots' rows. A last, wide kernel copies the rows. Slot order within an expert is kept, as on the
// CPU, so offsets and row_of_slot are the CPU's exactly. Ids outside the owned range (including
// invalid ones, which the CPU rejects) get row -1.
//
// moe_unpermute_combine: blocks of (token, column range): out = w_0 y_0, then out += w_i y_i in
// top-k order, each product and sum rounded separately (no fused multiply-add), as the CPU's loop
// does. A row outside [-1, R) (a caller bug the CPU aborts on) makes the token's output NaN.
//
// Activations (x, x_sorted, y, out) are f32 or bf16 each: loaded as f32, summed in f32, rounded
// to nearest even once when stored as bf16. Same-dtype copies (permute) move the bits unchanged.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
using bf16 = __nv_bfloat16;

// ---- activations: f32 or bf16 ------------------------------------------------------------------

template <typename T>
struct Of {
  using type = T;
};
// fn(Of<A>{}, Of<B>{}) with A, B float or bf16 as the flags say: one instantiation per pair.
template <typename Fn>
void with_types(bool a_bf16, bool b_bf16, const Fn& fn) {
  if (a_bf16) {
    if (b_bf16) return fn(Of<bf16>{}, Of<bf16>{});
    return fn(Of<bf16>{}, Of<float>{});
  }
  if (b_bf16) return fn(Of<float>{}, Of<bf16>{});
  fn(Of<float>{}, Of<float>{});
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f32(float v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

// Four consecutive elements at p (16 bytes of f32 or 8 of bf16, as aligned), as f32.
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(bf16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  *reinterpret_cast<uint2*>(p) =
      make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}
// Four elements' raw bits, for copies between tensors of one dtype.
template <typename T>
using Quad = std::conditional_t<sizeof(T) == 4, float4, uint2>;

// ---- moe_route ---------------------------------------------------------------------------------

constexpr int kRouteWarps = 4;     // tokens per block
constexpr int kRoutePerLane = 16;  // experts a lane holds in registers for the picks (E <= 512)

// exp rounded as the CPU's std::exp(float) (glibc expf, < 0.502 ulp): via double.
__device__ __forceinline__ float exp_as_host(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

struct Pick {
  float v;
  int i;  // INT_MAX: none
};
// a before b: larger value, then lower index; an empty pick never comes first.
__device__ __forceinline__ bool before(const Pick& a, const Pick& b) {
  if (a.i == INT_MAX) return false;
  if (b.i == INT_MAX) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}
// A routing candidate as one ordered 64-bit key: the score's bits mapped so that unsigned order
// is float order (-0 taken as +0, which compares equal to it; NaN below everything), then
// 0xffffffff - index so that of equal scores the lower index is larger. Never 0 (the index part
// is at least 2^32 - 2^31).
__device__ __forceinline__ uint64_t pick_key(float v, int index) {
  const uint32_t b = __float_as_uint(v + 0.0f);
  const uint32_t ordered = v != v ? 0u : (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}
__device__ __forceinline__ int key_index(uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
}

__device__ __forceinline__ Pick warp_best(Pick p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Pick q{__shfl_xor_sync(kFull, p.v, o), __shfl_xor_sync(kFull, p.i, o)};
    if (before(q, p)) p = q;
  }
  return p;
}

// Dynamic shared memory: per warp, E selection scores, E group scores, then the E logits (for a
// sigmoid router, their sigmoids). A sigmoid router's scores are computed by the whole block
// for its tokens before each warp selects for its own: at decode (one token a launch) a warp
// alone spent most of the kernel's 13 us in the serial double-precision exps of its 8 experts a
// lane (ncu, s19d); the block's 128 threads take 2 each. The logits (and the bias) are otherwise
// staged first, every load of the row in flight at once.
template <bool kSigmoid>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t T, int E,
                 int K, int n_group, int topk_group, bool grouped, bool renormalize, float scaling,
                 int32_t* __restrict__ ids, float* __restrict__ weights) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kRouteWarps;
  if constexpr (kSigmoid) {
    const int tokens = T - t0 < kRouteWarps ? static_cast<int>(T - t0) : kRouteWarps;
#pragma unroll 2
    for (int idx = threadIdx.x; idx < tokens * E; idx += blockDim.x) {
      const int w = idx / E, j = idx - w * E;
      float* sel_w = route_smem + static_cast<size_t>(w) * 3 * E;
      const float s = 1.0f / (1.0f + exp_as_host(-logits[(t0 + w) * E + j]));
      sel_w[2 * E + j] = s;  // the expert's score, read again for the weights
      sel_w[j] = bias ? s + bias[j] : s;
    }
    __syncthreads();
  }
  const int64_t t = t0 + warp;
  if (t >= T) return;  // no block-wide synchronisation below
  float* sel = route_smem + static_cast<size_t>(warp) * 3 * E;
  float* gsc = sel + E;
  float* l = gsc + E;  // this token's logits (softmax) or scores (sigmoid)
  if constexpr (!kSigmoid) {
    const float* lt = logits + t * E;
#pragma unroll 8
    for (int j = lane; j < E; j += 32) l[j] = lt[j];
  }
  __syncwarp();

  float mx = 0.0f, sum = 1.0f;  // softmax: max logit and the sum of exps
  if constexpr (!kSigmoid) {    // (a sigmoid router's scores are in place: above)
    mx = -INFINITY;
    for (int j = lane; j < E; j += 32) mx = fmaxf(mx, l[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    for (int j = lane; j < E; j += 32) sel[j] = exp_as_host(l[j] - mx);
    __syncwarp();
    if (lane == 0) {
      float s = 0.0f;
      for (int j = 0; j < E; ++j) s += sel[j];  // in expert order, as the CPU
      gsc[0] = s;
    }
    __syncwarp();
    sum = gsc[0];
    __syncwarp();
    for (int j = lane; j < E; j += 32) {
      const float s = sel[j] / sum;
      sel[j] = bias ? s + bias[j] : s;
    }
  }
  __syncwarp();

  if (grouped) {
    // Group score: the sum of the group's two largest selection scores (found in expert order).
    const int gsize = E / n_group;
    for (int g = lane; g < n_group; g += 32) {
      const float* v = sel + g * gsize;
      float a = -INFINITY, b = -INFINITY;
      for (int j = 0; j < gsize; ++j) {
        if (v[j] > a) {
          b = a;
          a = v[j];
        } else if (v[j] > b) {
          b = v[j];
        }
      }
      gsc[g] = a + b;
    }
    __syncwarp();
    uint32_t kept = 0;  // bit i: group lane + 32 i kept
    for (int c = 0; c < topk_group; ++c) {
      Pick p{0.0f, INT_MAX};
      for (int g = lane, i = 0; g < n_group; g += 32, ++i) {
        const Pick q{gsc[g], g};
        if (!(kept >> i & 1u) && before(q, p)) p = q;
      }
      p = warp_best(p);
      if (p.i != INT_MAX && (p.i & 31) == lane) kept |= 1u << (p.i >> 5);
    }
    __syncwarp();
    for (int g = lane, i = 0; g < n_group; g += 32, ++i) gsc[g] = (kept >> i & 1u) ? 1.0f : 0.0f;
    __syncwarp();
    for (int j = lane; j < E; j += 32) {
      if (gsc[j / gsize] == 0.0f) sel[j] = -INFINITY;
    }
    __syncwarp();
  }

  // The picks, in order, into the group-score area (free now); then their scores, in parallel,
  // into the selection area (free then).
  int* picked = reinterpret_cast<int*>(gsc);
  uint32_t taken = 0;  // bit i: expert lane + 32 i picked
  if (E <= 32 * kRoutePerLane) {
    // Each lane keeps its experts as 64-bit keys in registers (pick_key: a larger key is a larger
    // score, then a lower index, as before() orders them; 0 is no expert) and its best remaining
    // one; a pick is one warp-wide max of the lanes' bests, after which only the winning lane
    // rescans its own. A decode step routes one token per launch, so this warp is most of the
    // kernel, latency-bound at ~9 cycles an instruction (ncu, s19f): rescanning every expert from
    // shared memory with Pick comparisons for each of the K picks made it ~13 us.
    uint64_t key[kRoutePerLane];
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int j = lane + 32 * i;
      key[i] = j < E ? pick_key(sel[j], j) : 0;
    }
    const auto lane_best = [&] {
      uint64_t b = 0;
#pragma unroll
      for (int i = 0; i < kRoutePerLane; ++i) b = max(b, key[i]);
      return b;
    };
    uint64_t mine = lane_best();
    for (int c = 0; c < K; ++c) {
      uint64_t best = mine;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(kFull, best, o));
      // No expert left (fewer than K): 0, which the host checks exclude.
      const int e = best == 0 ? 0 : key_index(best);
      if (best != 0 && (e & 31) == lane) {
#pragma unroll
        for (int i = 0; i < kRoutePerLane; ++i) {
          if (i == e >> 5) key[i] = 0;  // selects, not a dynamically indexed (local) array
        }
        mine = lane_best();
      }
      if (lane == 0) picked[c] = e;
    }
  } else {
    for (int c = 0; c < K; ++c) {
      Pick p{0.0f, INT_MAX};
      for (int j = lane, i = 0; j < E; j += 32, ++i) {
        const Pick q{sel[j], j};
        if (!(taken >> i & 1u) && before(q, p)) p = q;
      }
      p = warp_best(p);
      if (p.i == INT_MAX) p.i = 0;  // fewer than K experts: the host checks exclude it
      if ((p.i & 31) == lane) taken |= 1u << (p.i >> 5);
      if (lane == 0) picked[c] = p.i;
    }
  }
  __syncwarp();
  float* score = sel;
  for (int c = lane; c < K; c += 32) {
    const int e = picked[c];
    score[c] = kSigmoid ? l[e] : exp_as_host(l[e] - mx) / sum;
  }
  __syncwarp();
  float denom = 1.0f;
  if (renormalize) {
    float wsum = 0.0f;  // in pick order, as the CPU
    for (int c = 0; c < K; ++c) wsum += score[c];
    denom = kSigmoid ? wsum + 1e-20f : wsum;
  }
  for (int c = lane; c < K; c += 32) {
    float w = score[c];
    if (renormalize) w /= denom;
    ids[t * K + c] = picked[c];
    weights[t * K + c] = w * scaling;
  }
}

// ---- moe_route_replay --------------------------------------------------------------------------

// One warp per row. A row whose replay starts with a negative id keeps the router's ids and
// weights. Others: each replayed expert not among the row's own top-k counts as differing, the ids
// are the replay's, and the weights are the replayed experts' scores from the logits by
// route_kernel's arithmetic (the CPU's: exp via double, the softmax sum in expert order in one
// lane, the renormalisation in slot order), so replaying a row's own experts gives its own weights.
// An id outside [0, E) (which validate_routing_replay rejects on the host) gives a NaN weight.
// Dynamic shared memory: E floats per warp (a softmax row's exps).
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_replay_kernel(const float* __restrict__ logits, const int32_t* __restrict__ replay,
                        int64_t T, int E, int K, bool sigmoid, bool renormalize, float scaling,
                        int32_t* __restrict__ ids, float* __restrict__ weights,
                        unsigned long long* __restrict__ counts) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  extern __shared__ float replay_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= T) return;
  const int32_t* r = replay + t * K;
  if (r[0] < 0) return;
  int32_t* own = ids + t * K;
  int differing = 0;
  for (int c = lane; c < K; c += 32) {
    bool found = false;
    for (int j = 0; j < K; ++j) found |= own[j] == r[c];
    differing += found ? 0 : 1;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) differing += __shfl_xor_sync(kFull, differing, o);
  if (lane == 0) {
    atomicAdd(&counts[0], static_cast<unsigned long long>(K));
    atomicAdd(&counts[1], static_cast<unsigned long long>(differing));
  }
  const float* l = logits + t * E;
  float mx = 0.0f, sum = 1.0f;
  if (!sigmoid) {
    float* ex = replay_smem + static_cast<size_t>(warp) * E;
    mx = -INFINITY;
    for (int j = lane; j < E; j += 32) mx = fmaxf(mx, l[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    for (int j = lane; j < E; j += 32) ex[j] = exp_as_host(l[j] - mx);
    __syncwarp();
    if (lane == 0) {
      float s = 0.0f;
      for (int j = 0; j < E; ++j) s += ex[j];  // in expert order, as the CPU
      ex[0] = s;
    }
    __syncwarp();
    sum = ex[0];
  }
  // Lane 0 alone: K scores summed in slot order (K is small: 2 to 16 in the supported models).
  __syncwarp();
  if (lane != 0) return;
  const auto score = [&](int e) {
    return e < 0 || e >= E ? NAN
           : sigmoid       ? 1.0f / (1.0f + exp_as_host(-l[e]))
                           : exp_as_host(l[e] - mx) / sum;
  };
  float denom = 1.0f;
  if (renormalize) {
    float wsum = 0.0f;
    for (int c = 0; c < K; ++c) wsum += score(r[c]);
    denom = sigmoid ? wsum + 1e-20f : wsum;
  }
  for (int c = 0; c < K; ++c) {
    const int e = r[c];
    float w = score(e);
    if (renormalize) w /= denom;
    own[c] = e;
    weights[t * K + c] = w * scaling;
  }
}

// ---- moe_permute -------------------------------------------------------------------------------

constexpr int kRankWarps = 32;

// Exclusive scan over the block (1024 threads); `smem` holds 32 ints. Every thread calls it.
__device__ __forceinline__ int block_exclusive_scan(int v, int* smem, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) smem[warp] = incl;
  __syncthreads();
  int wsum = lane < kRankWarps ? smem[lane] : 0;
  int wincl = wsum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(kFull, wincl, o);
    if (lane >= o) wincl += n;
  }
  const int warp_base = __shfl_sync(kFull, wincl - wsum, warp);
  *total = __shfl_sync(kFull, wincl, 31);
  return warp_base + incl - v;
}

// Dynamic shared memory: tab [32][ne] (per segment and expert: a count, then the segment's next
// row), base [ne] (the expert's first row), 32 ints of scan scratch.
__device__ __forceinline__ void rank_slots(const int32_t* __restrict__ ids, int64_t slots,
                                           int64_t first, int ne, int32_t* __restrict__ offsets,
                                           int32_t* __restrict__ row_of_slot) {
  extern __shared__ int rank_smem[];
  int* tab = rank_smem;
  int* base = tab + kRankWarps * ne;
  int* scan = base + ne;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kRankWarps * ne; i += blockDim.x) tab[i] = 0;
  __syncthreads();

  const int64_t seg = (slots + kRankWarps - 1) / kRankWarps;
  const int64_t begin = warp * seg, end = min(slots, begin + seg);
  int* mine = tab + warp * ne;
  const auto expert_of = [&](int64_t j) {
    if (j >= end) return -1;
    const int64_t e = static_cast<int64_t>(ids[j]) - first;
    return e >= 0 && e < ne ? static_cast<int>(e) : -1;
  };
  for (int64_t j0 = begin; j0 < end; j0 += 32) {
    const int e = expert_of(j0 + lane);
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();

  // Per expert: the segments' counts become their first rows (relative to the expert's).
  int total = 0;
  for (int e = threadIdx.x; e < ne; e += blockDim.x) {
    int run = 0;
    for (int w = 0; w < kRankWarps; ++w) {
      const int c = tab[w * ne + e];
      tab[w * ne + e] = run;
      run += c;
    }
    base[e] = run;
  }
  __syncthreads();
  // The experts' first rows: an exclusive scan of their counts (ne <= 1024: one per thread).
  const int count = threadIdx.x < ne ? base[threadIdx.x] : 0;
  const int first_row = block_exclusive_scan(count, scan, &total);
  if (threadIdx.x < ne) {
    base[threadIdx.x] = first_row;
    offsets[threadIdx.x] = first_row;
  }
  if (threadIdx.x == 0) offsets[ne] = total;
  __syncthreads();

  for (int64_t j0 = begin; j0 < end; j0 += 32) {
    const int64_t j = j0 + lane;
    const int e = expert_of(j);
    const unsigned peers = __match_any_sync(kFull, e);
    int row = -1;
    if (e >= 0) row = base[e] + mine[e] + __popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
    if (j < end) row_of_slot[j] = row;
  }
}

__global__ void __launch_bounds__(kRankWarps * 32)
    permute_rank_kernel(const int32_t* __restrict__ ids, int64_t slots, int64_t first, int ne,
                        int32_t* __restrict__ offsets, int32_t* __restrict__ row_of_slot) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  rank_slots(ids, slots, first, ne, offsets, row_of_slot);
}

// The same ranking for many slots, over chunks of kChunkSlots slots (warp w of a chunk's block
// owns its w-th kWarpSlots slots): count (per chunk and expert), scan (one block: offsets, and
// each chunk's first row per expert), assign (per chunk: the warps' first rows per expert, then
// each slot its row, in slot order).
constexpr int kChunkWarps = 8, kWarpSlots = 256, kChunkSlots = kChunkWarps * kWarpSlots;

__device__ __forceinline__ int owned_expert(const int32_t* ids, int64_t j, int64_t end,
                                            int64_t first, int ne) {
  if (j >= end) return -1;
  const int64_t e = static_cast<int64_t>(ids[j]) - first;
  return e >= 0 && e < ne ? static_cast<int>(e) : -1;
}

// counts[chunk][e]: the chunk's slots routed to owned expert e. Dynamic shared memory: ne ints.
__global__ void __launch_bounds__(kChunkWarps * 32)
    permute_count_kernel(const int32_t* __restrict__ ids, int64_t slots, int64_t first, int ne,
                         int32_t* __restrict__ counts) {
  extern __shared__ int count_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < ne; i += blockDim.x) count_smem[i] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkSlots;
  const int64_t end = min(slots, begin + kChunkSlots);
  for (int64_t j0 = begin + warp * 32; j0 < end; j0 += kChunkWarps * 32) {
    const int e = owned_expert(ids, j0 + lane, end, first, ne);
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && lane == __ffs(peers) - 1) atomicAdd(&count_smem[e], __popc(peers));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < ne; i += blockDim.x)
    counts[static_cast<int64_t>(blockIdx.x) * ne + i] = count_smem[i];
}

// One block of 1024 threads, thread e for owned expert e (ne <= 1024): offsets, and
// counts[chunk][e] replaced by the chunk's first row of expert e.
__global__ void __launch_bounds__(kRankWarps * 32)
    permute_scan_kernel(int32_t* __restrict__ counts, int64_t chunks, int ne,
                        int32_t* __restrict__ offsets) {
  __shared__ int scan[32];
  const int e = threadIdx.x;
  int count = 0;
  if (e < ne)
    for (int64_t c = 0; c < chunks; ++c) count += counts[c * ne + e];
  int total = 0;
  const int first_row = block_exclusive_scan(count, scan, &total);
  if (e < ne) {
    offsets[e] = first_row;
    int run = first_row;
    for (int64_t c = 0; c < chunks; ++c) {
      const int v = counts[c * ne + e];
      counts[c * ne + e] = run;
      run += v;
    }
  }
  if (threadIdx.x == 0) offsets[ne] = total;
}

// Dynamic shared memory: [kChunkWarps][ne] ints (per warp and expert: a count, then the next row).
__global__ void __launch_bounds__(kChunkWarps * 32)
    permute_assign_kernel(const int32_t* __restrict__ ids, int64_t slots, int64_t first, int ne,
                          const int32_t* __restrict__ chunk_rows,
                          int32_t* __restrict__ row_of_slot) {
  extern __shared__ int assign_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kChunkWarps * ne; i += blockDim.x) assign_smem[i] = 0;
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunkSlots + warp * kWarpSlots;
  const int64_t end = min(slots, begin + kWarpSlots);
  int* mine = assign_smem + warp * ne;
  for (int64_t j0 = begin; j0 < end; j0 += 32) {
    const int e = owned_expert(ids, j0 + lane, end, first, ne);
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  const int32_t* base = chunk_rows + static_cast<int64_t>(blockIdx.x) * ne;
  for (int e = threadIdx.x; e < ne; e += blockDim.x) {
    int run = base[e];
    for (int w = 0; w < kChunkWarps; ++w) {
      const int c = assign_smem[w * ne + e];
      assign_smem[w * ne + e] = run;
      run += c;
    }
  }
  __syncthreads();
  for (int64_t j0 = begin; j0 < end; j0 += 32) {
    const int64_t j = j0 + lane;
    const int e = owned_expert(ids, j, end, first, ne);
    const unsigned peers = __match_any_sync(kFull, e);
    int row = -1;
    if (e >= 0) row = mine[e] + __popc(peers & ((1u << lane) - 1u));
    __syncwarp();
    if (e >= 0 && lane == __ffs(peers) - 1) mine[e] += __popc(peers);
    __syncwarp();
    if (j < end) row_of_slot[j] = row;
  }
}

// Lane `lane` of a warp's share of x_sorted[row] = x[j / K] (bits copied between one dtype,
// converted between two); rows outside [0, R) (unowned slots: -1) are skipped.
template <typename Tx, typename Ts, bool kVec4>
__device__ __forceinline__ void copy_slot_row(const Tx* __restrict__ x, int64_t row,
                                              Ts* __restrict__ x_sorted, int64_t j, int64_t K,
                                              int64_t D, int64_t R, int lane) {
  constexpr bool kSame = std::is_same_v<Tx, Ts>;
  if (row < 0 || row >= R) return;
  const Tx* src = x + (j / K) * D;
  Ts* dst = x_sorted + row * D;
  if constexpr (kVec4 && kSame) {
    const Quad<Tx>* s4 = reinterpret_cast<const Quad<Tx>*>(src);
    Quad<Ts>* d4 = reinterpret_cast<Quad<Ts>*>(dst);
    for (int64_t c = lane; c < D / 4; c += 32) d4[c] = s4[c];
  } else if constexpr (kVec4) {
    for (int64_t c = lane; c < D / 4; c += 32) store4(dst + 4 * c, load4(src + 4 * c));
  } else if constexpr (kSame) {
    for (int64_t c = lane; c < D; c += 32) dst[c] = src[c];
  } else {
    for (int64_t c = lane; c < D; c += 32) dst[c] = from_f32<Ts>(to_f32(src[c]));
  }
}

// One warp per slot: x_sorted[row_of_slot[j]] = x[j / K] (bits copied between one dtype,
// converted between two).
template <typename Tx, typename Ts, bool kVec4>
__global__ void __launch_bounds__(256)
    permute_copy_kernel(const Tx* __restrict__ x, const int32_t* __restrict__ row_of_slot,
                        Ts* __restrict__ x_sorted, int64_t slots, int64_t K, int64_t D, int64_t R) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       j < slots; j += warps) {
    copy_slot_row<Tx, Ts, kVec4>(x, row_of_slot[j], x_sorted, j, K, D, R, lane);
  }
}

// A decode step's few slots (at most kFusedPermuteSlots): the ranking and the copies in one block,
// one kernel instead of two (~3 us each at one token, 26 MoE layers a step: bench/results).
constexpr int64_t kFusedPermuteSlots = 32;
template <typename Tx, typename Ts, bool kVec4>
__global__ void __launch_bounds__(kRankWarps * 32)
    permute_rank_copy_kernel(const int32_t* __restrict__ ids, int64_t slots, int64_t first, int ne,
                             int32_t* __restrict__ offsets, int32_t* __restrict__ row_of_slot,
                             const Tx* __restrict__ x, Ts* __restrict__ x_sorted, int64_t K,
                             int64_t D, int64_t R) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  rank_slots(ids, slots, first, ne, offsets, row_of_slot);
  __syncthreads();  // the block's row_of_slot stores are visible to the whole block after it
  const int lane = threadIdx.x & 31;
  for (int64_t j = threadIdx.x >> 5; j < slots; j += kRankWarps)
    copy_slot_row<Tx, Ts, kVec4>(x, row_of_slot[j], x_sorted, j, K, D, R, lane);
}

// ---- moe_unpermute_combine ---------------------------------------------------------------------

constexpr int kCombineThreads = 128;

// A finished sum as out's type holds it, plus the addend's element when there is one: the bits of
// storing the sum and then add_inplace (f32 addition of the two, rounded once to To).
template <typename To>
__device__ __forceinline__ float plus_addend(float sum, const To* __restrict__ addend, int64_t i) {
  if (addend == nullptr) return sum;
  return to_f32(from_f32<To>(sum)) + to_f32(addend[i]);
}

// Block (t, b) takes token t's columns (quads with vector loads) b * kCombineThreads + thread,
// then every gridDim.y * kCombineThreads-th.
template <typename Ty, typename To, bool kVec4>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const Ty* __restrict__ y, const int32_t* __restrict__ rows,
                   const float* __restrict__ weights, To* __restrict__ out,
                   const To* __restrict__ addend, int64_t K, int64_t D, int64_t R) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int64_t t = blockIdx.x;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  const int32_t* row = rows + t * K;
  const float* w = weights + t * K;
  bool bad = false, any = false;
  for (int64_t i = 0; i < K; ++i) {
    bad |= row[i] < -1 || row[i] >= R;
    any |= row[i] >= 0;
  }
  To* o = out + t * D;
  const To* add = addend != nullptr ? addend + t * D : nullptr;
  if (bad || !any) {
    const float fill = bad ? __int_as_float(0x7fc00000) : 0.0f;
    for (int64_t c = c0; c < D; c += step) o[c] = from_f32<To>(plus_addend(fill, add, c));
    return;
  }
  if constexpr (kVec4) {
    for (int64_t c = c0; c < D / 4; c += step) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      bool first = true;
      for (int64_t i = 0; i < K; ++i) {
        if (row[i] < 0) continue;
        const float4 v = load4(y + static_cast<int64_t>(row[i]) * D + 4 * c);
        const float wi = w[i];
        if (first) {
          acc = make_float4(__fmul_rn(wi, v.x), __fmul_rn(wi, v.y), __fmul_rn(wi, v.z),
                            __fmul_rn(wi, v.w));
          first = false;
        } else {
          acc.x = __fadd_rn(acc.x, __fmul_rn(wi, v.x));
          acc.y = __fadd_rn(acc.y, __fmul_rn(wi, v.y));
          acc.z = __fadd_rn(acc.z, __fmul_rn(wi, v.z));
          acc.w = __fadd_rn(acc.w, __fmul_rn(wi, v.w));
        }
      }
      if (add != nullptr) {
        acc = make_float4(plus_addend(acc.x, add, 4 * c), plus_addend(acc.y, add, 4 * c + 1),
                          plus_addend(acc.z, add, 4 * c + 2), plus_addend(acc.w, add, 4 * c + 3));
      }
      store4(o + 4 * c, acc);
    }
  } else {
    for (int64_t c = c0; c < D; c += step) {
      float acc = 0.0f;
      bool first = true;
      for (int64_t i = 0; i < K; ++i) {
        if (row[i] < 0) continue;
        const float p = __fmul_rn(w[i], to_f32(y[static_cast<int64_t>(row[i]) * D + c]));
        acc = first ? p : __fadd_rn(acc, p);
        first = false;
      }
      o[c] = from_f32<To>(plus_addend(acc, add, c));
    }
  }
}

}  // namespace

namespace launch {

void moe_route(cudaStream_t stream, const float* logits, const float* bias, int64_t T, int E, int K,
               int n_group, int topk_group, bool sigmoid, bool renormalize, float routed_scaling,
               int32_t* ids, float* weights) {
  if (T == 0) return;
  const int64_t blocks = (T + kRouteWarps - 1) / kRouteWarps;
  LOOM_CHECK_GRID(blocks);
  const size_t smem = sizeof(float) * 3 * static_cast<size_t>(E) * kRouteWarps;
  const bool grouped = n_group > 1 && topk_group < n_group;
  if (sigmoid) {
    LOOM_MARK_PDL_KERNEL(route_kernel<true>);
    route_kernel<true><<<static_cast<unsigned>(blocks), kRouteWarps * 32, smem, stream>>>(
        logits, bias, T, E, K, n_group, topk_group, grouped, renormalize, routed_scaling, ids,
        weights);
  } else {
    LOOM_MARK_PDL_KERNEL(route_kernel<false>);
    route_kernel<false><<<static_cast<unsigned>(blocks), kRouteWarps * 32, smem, stream>>>(
        logits, bias, T, E, K, n_group, topk_group, grouped, renormalize, routed_scaling, ids,
        weights);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void moe_route_replay(cudaStream_t stream, const float* logits, const int32_t* replay, int64_t T,
                      int E, int K, bool sigmoid, bool renormalize, float routed_scaling,
                      int32_t* ids, float* weights, int64_t* counts) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(int64_t), stream));
  if (T == 0) return;
  const int64_t blocks = (T + kRouteWarps - 1) / kRouteWarps;
  LOOM_CHECK_GRID(blocks);
  const size_t smem = sizeof(float) * static_cast<size_t>(E) * kRouteWarps;
  LOOM_MARK_PDL_KERNEL(route_replay_kernel);
  route_replay_kernel<<<static_cast<unsigned>(blocks), kRouteWarps * 32, smem, stream>>>(
      logits, replay, T, E, K, sigmoid, renormalize, routed_scaling, ids, weights,
      reinterpret_cast<unsigned long long*>(counts));
  LOOM_CUDA_CHECK_LAUNCH();
}

size_t moe_permute_scratch_bytes(int64_t slots, int64_t ne) {
  if (slots <= kMoePermuteOneBlockSlots) return 0;
  return sizeof(int32_t) * static_cast<size_t>((slots + kChunkSlots - 1) / kChunkSlots * ne);
}

void moe_permute(cudaStream_t stream, const void* x, bool x_bf16, const int32_t* ids, int64_t T,
                 int64_t K, int64_t D, int64_t first_expert, int64_t ne, int32_t* offsets,
                 int32_t* row_of_slot, void* x_sorted, bool xs_bf16, int64_t R, bool vec4,
                 void* scratch) {
  const int64_t slots = T * K;
  const int n = static_cast<int>(ne);
  const size_t rank_smem = sizeof(int) * (static_cast<size_t>(kRankWarps + 1) * ne + 32);
  if (slots > 0 && slots <= kFusedPermuteSlots && D > 0 && ne > 0 && rank_smem <= 48 * 1024) {
    with_types(x_bf16, xs_bf16, [&](auto tx, auto ts) {
      using Tx = typename decltype(tx)::type;
      using Ts = typename decltype(ts)::type;
      const Tx* src = static_cast<const Tx*>(x);
      Ts* dst = static_cast<Ts*>(x_sorted);
      if (vec4) {
        LOOM_MARK_PDL_KERNEL((permute_rank_copy_kernel<Tx, Ts, true>));
        permute_rank_copy_kernel<Tx, Ts, true><<<1, kRankWarps * 32, rank_smem, stream>>>(
            ids, slots, first_expert, n, offsets, row_of_slot, src, dst, K, D, R);
      } else {
        LOOM_MARK_PDL_KERNEL((permute_rank_copy_kernel<Tx, Ts, false>));
        permute_rank_copy_kernel<Tx, Ts, false><<<1, kRankWarps * 32, rank_smem, stream>>>(
            ids, slots, first_expert, n, offsets, row_of_slot, src, dst, K, D, R);
      }
    });
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  if (slots <= kMoePermuteOneBlockSlots) {
    const size_t smem = rank_smem;
    if (smem > 48 * 1024) {
      // The opt-in to more than 48 KiB of dynamic shared memory is per device: once each.
      static std::atomic<uint64_t> done{0};
      int device = 0;
      LOOM_CUDA_CHECK(cudaGetDevice(&device));
      const uint64_t bit = uint64_t{1} << (device & 63);
      if ((done.load(std::memory_order_acquire) & bit) == 0) {
        LOOM_CUDA_CHECK(cudaFuncSetAttribute(
            permute_rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
            static_cast<int>(sizeof(int) * ((kRankWarps + 1) * kMoePermuteMaxExperts + 32))));
        done.fetch_or(bit, std::memory_order_acq_rel);
      }
    }
    LOOM_MARK_PDL_KERNEL(permute_rank_kernel);
    permute_rank_kernel<<<1, kRankWarps * 32, smem, stream>>>(ids, slots, first_expert, n, offsets,
                                                              row_of_slot);
    LOOM_CUDA_CHECK_LAUNCH();
  } else {
    const int64_t chunks = (slots + kChunkSlots - 1) / kChunkSlots;
    LOOM_CHECK_GRID(chunks);
    int32_t* counts = static_cast<int32_t*>(scratch);
    permute_count_kernel<<<static_cast<unsigned>(chunks), kChunkWarps * 32, sizeof(int) * ne,
                           stream>>>(ids, slots, first_expert, n, counts);
    LOOM_CUDA_CHECK_LAUNCH();
    permute_scan_kernel<<<1, kRankWarps * 32, 0, stream>>>(counts, chunks, n, offsets);
    LOOM_CUDA_CHECK_LAUNCH();
    permute_assign_kernel<<<static_cast<unsigned>(chunks), kChunkWarps * 32,
                            sizeof(int) * kChunkWarps * ne, stream>>>(ids, slots, first_expert, n,
                                                                      counts, row_of_slot);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (slots == 0 || D == 0 || ne == 0) return;
  const unsigned blocks = dev::grid_for(slots, 8);
  with_types(x_bf16, xs_bf16, [&](auto tx, auto ts) {
    using Tx = typename decltype(tx)::type;
    using Ts = typename decltype(ts)::type;
    const Tx* src = static_cast<const Tx*>(x);
    Ts* dst = static_cast<Ts*>(x_sorted);
    if (vec4) {
      LOOM_MARK_PDL_KERNEL((permute_copy_kernel<Tx, Ts, true>));
      permute_copy_kernel<Tx, Ts, true>
          <<<blocks, 256, 0, stream>>>(src, row_of_slot, dst, slots, K, D, R);
    } else {
      LOOM_MARK_PDL_KERNEL((permute_copy_kernel<Tx, Ts, false>));
      permute_copy_kernel<Tx, Ts, false>
          <<<blocks, 256, 0, stream>>>(src, row_of_slot, dst, slots, K, D, R);
    }
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_combine(cudaStream_t stream, const void* y, bool y_bf16, const int32_t* rows,
                           const float* weights, void* out, bool out_bf16, const void* addend,
                           int64_t T, int64_t K, int64_t D, int64_t R, bool vec4) {
  if (T == 0 || D == 0) return;
  LOOM_CHECK_GRID(T);
  // Enough column blocks per token that a few tokens still spread over the GPU.
  const int64_t per_block = kCombineThreads * (vec4 ? 4 : 1);
  const int64_t col_blocks = std::min<int64_t>((D + per_block - 1) / per_block, 65535);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(col_blocks));
  with_types(y_bf16, out_bf16, [&](auto ty, auto to) {
    using Ty = typename decltype(ty)::type;
    using To = typename decltype(to)::type;
    const Ty* src = static_cast<const Ty*>(y);
    To* dst = static_cast<To*>(out);
    const To* add = static_cast<const To*>(addend);
    if (vec4) {
      LOOM_MARK_PDL_KERNEL((combine_kernel<Ty, To, true>));
      combine_kernel<Ty, To, true>
          <<<grid, kCombineThreads, 0, stream>>>(src, rows, weights, dst, add, K, D, R);
    } else {
      LOOM_MARK_PDL_KERNEL((combine_kernel<Ty, To, false>));
      combine_kernel<Ty, To, false>
          <<<grid, kCombineThreads, 0, stream>>>(src, rows, weights, dst, add, K, D, R);
    }
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
