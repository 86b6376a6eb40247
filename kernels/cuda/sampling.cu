// The batched sampler on the GPU: SamplerState::sample's arithmetic (engine/sampling/sampler.cc)
// row by row, so that a row given the same logits and the same uniform draw picks the same token.
//
// Order of the launches (each skipped when no row needs it):
//   1. rows with logprobs: the raw logits' log-sum-exp and top-n (n <= 20), before any edit.
//      top_partial: blocks of 4096 entries (staged in shared memory) give a max, a sum of
//      exp(l - max) in double and their top-n, picked in n rounds of a block argmax over the
//      entries that come after the previous pick in (logit desc, id asc) order; top_final merges
//      a row's chunks the same way (chunk sums combined in chunk order, so the result does not
//      depend on timing).
//   2. apply_edits: one thread per edited (row, id): logit bias, repetition penalty,
//      presence/frequency penalty, min_tokens mask, as the CPU applies them (each operation
//      rounded on its own: no fused multiply-add), in place; the raw value is kept for step 5.
//   3. greedy rows: the same two kernels with n = 1 (an argmax, ties to the lower id): no sort.
//   4. sampled rows, kSampleSortGroup at a time: the row's (processed logit, id) pairs sorted by
//      CUB's radix sort, descending and stable, so equal logits keep ascending ids (the CPU's
//      comparator; CUB also treats -0 and +0 as equal, as the comparison does). Then over the
//      top-k prefix, in blocks of 2048 sorted entries: samp_z sums e_i = exp((l_i - max) / T) in
//      double, samp_scan scans p_i = e_i / z within each block (the block's running sum at its
//      last entry, and how many p_i reach the min-p threshold), and samp_pick walks the blocks'
//      totals in order to find the top-p cut, the min-p cut, the kept total and the inverse-CDF
//      pick u * total < cum_i, re-scanning only the one block where each falls. z and the block
//      prefixes are summed sequentially by one thread from the same partials in every kernel, and
//      a block's scan is the same code everywhere, so every kernel sees the same cum_i. The CPU
//      sums the same terms left to right: the running sums agree to double rounding (~1e-16), so
//      a pick can differ only when u or top_p falls within that of a boundary.
//   5. rows with logprobs: the chosen token's raw logit minus the log-sum-exp.
//
// Why a sort for sampled rows: the CPU's pick walks the candidates in sorted order, so the same
// token needs the same order at least up to the top-p cut and the pick. Sorting everything is the
// simple way to get it; at V = 163840 on an H200 it costs ~120 us for one row (CUB's radix sort
// over the whole GPU) and ~1.4 ms for 64 rows (segmented, one block a row), against ~28 us and
// ~55 us for greedy rows (tests/gpu/sampling_cuda_bench.cc). Sorting only the top few thousand
// entries (a radix select for the threshold), with z and the tail mass summed unsorted and a full
// sort only for a row whose cut or pick falls past them, would remove most of that.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cub/cub.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling_launch.h"

namespace loom::cuda {
namespace {

using launch::SampleArgs;
using launch::SampleEdit;
using launch::SampleOut;
using launch::SampleRow;
using launch::SampleSortPath;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kNone = INT_MAX;  // an empty pick

constexpr int kTopThreads = 256;
constexpr int kTopChunk = 4096;  // entries per top_partial block (16 KB of shared memory)

constexpr int kScanThreads = 256;
constexpr int kScanItems = 8;  // consecutive sorted entries per thread
constexpr int kScanChunk = kScanThreads * kScanItems;
constexpr int kMaxScanChunks = static_cast<int>(launch::kSampleMaxVocab / kScanChunk);

// Up to this many sampled rows are sorted one by one (each sort spreads over the GPU: ~70 us a
// row at V = 163840 on an H200); more by one segmented sort (one block per row: ~1 ms for 1 to
// 64 rows). tests/gpu/sampling_cuda_bench.cc measures both.
constexpr int kPerRowSortMaxRows = 12;

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct Pick {
  float v;
  int32_t id;  // kNone: empty
};
// a before b: larger value, then lower id; an empty pick never comes first. NaN never does
// either (every comparison with it is false).
__device__ __forceinline__ bool before(const Pick& a, const Pick& b) {
  if (a.id == kNone) return false;
  if (b.id == kNone) return true;
  return a.v > b.v || (a.v == b.v && a.id < b.id);
}
__device__ __forceinline__ Pick warp_best(Pick p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Pick q{__shfl_xor_sync(kFull, p.v, o), __shfl_xor_sync(kFull, p.id, o)};
    if (before(q, p)) p = q;
  }
  return p;
}
// Every thread gets the block's first pick. Contains __syncthreads.
__device__ __forceinline__ Pick block_best(Pick p, Pick* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  p = warp_best(p);
  __syncthreads();
  if (lane == 0) smem[warp] = p;
  __syncthreads();
  p = lane < nw ? smem[lane] : Pick{0.0f, kNone};
  return warp_best(p);
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : -INFINITY;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
// A fixed reduction tree: the same inputs give the same bits.
__device__ __forceinline__ double block_sum_d(double v, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// ---- 1 and 3: top-n (and the log-sum-exp) over raw or processed rows -------------------------

// Block (c, j): chunk c of the row rows[list[j]]. kStats: logprob rows (n = the row's logprobs,
// plus the chunk's max and sum of exp(l - max)); else n = 1 (greedy). Picks go to
// cand[(j * nchunks + c) * stride + r].
template <bool kStats>
__global__ void __launch_bounds__(kTopThreads)
    top_partial(const float* __restrict__ logits, int64_t V, const SampleRow* __restrict__ rows,
                const int32_t* __restrict__ list, int nchunks, int stride, Pick* cand, float* pmax,
                double* psum) {
  __shared__ float vals[kTopChunk];
  __shared__ Pick red[32];
  __shared__ float redf[32];
  __shared__ double redd[32];
  const int j = blockIdx.y, c = blockIdx.x;
  const SampleRow rp = rows[list[j]];
  const int n = kStats ? rp.logprobs : 1;
  const int64_t lo = static_cast<int64_t>(c) * kTopChunk;
  const int len = static_cast<int>(min64(kTopChunk, V - lo));
  const float* src = logits + static_cast<int64_t>(rp.row) * V + lo;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = src[i];
    vals[i] = v;
    m = fmaxf(m, v);
  }
  const int64_t part = static_cast<int64_t>(j) * nchunks + c;
  if constexpr (kStats) {
    m = block_max(m, redf);
    double s = 0.0;
    if (m != -INFINITY) {  // each thread reads back only what it wrote
      for (int i = threadIdx.x; i < len; i += blockDim.x)
        s += exp(static_cast<double>(vals[i]) - static_cast<double>(m));
    }
    s = block_sum_d(s, redd);
    if (threadIdx.x == 0) {
      pmax[part] = m;
      psum[part] = s;
    }
  }
  __syncthreads();
  Pick last{INFINITY, -1};  // before every entry
  for (int r = 0; r < n; ++r) {
    Pick best{0.0f, kNone};
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      const Pick x{vals[i], static_cast<int32_t>(lo + i)};
      if (before(last, x) && before(x, best)) best = x;
    }
    best = block_best(best, red);
    if (threadIdx.x == 0) cand[part * stride + r] = best;
    last = best;
    if (best.id == kNone) {  // the chunk is exhausted: the remaining picks are empty too
      for (int q = r + 1 + threadIdx.x; q < n; q += blockDim.x) cand[part * stride + q] = best;
      break;
    }
  }
}

// Block j merges row rows[list[j]]'s chunks: kStats writes the top-n raw logprobs and logz[row
// index]; else the greedy token.
template <bool kStats>
__global__ void __launch_bounds__(kTopThreads)
    top_final(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ list,
              int nchunks, int stride, const Pick* __restrict__ cand,
              const float* __restrict__ pmax, const double* __restrict__ psum, float* logz,
              SampleOut* out) {
  __shared__ Pick red[32];
  __shared__ float log_z_s;
  const int j = blockIdx.x;
  const int ri = list[j];
  const SampleRow rp = rows[ri];
  const int n = kStats ? rp.logprobs : 1;
  const int64_t base = static_cast<int64_t>(j) * nchunks;
  if constexpr (kStats) {
    if (threadIdx.x == 0) {
      float mx = -INFINITY;
      for (int c = 0; c < nchunks; ++c) mx = fmaxf(mx, pmax[base + c]);
      double z = 0.0;
      for (int c = 0; c < nchunks; ++c) {
        const float m = pmax[base + c];
        if (m != -INFINITY)
          z += psum[base + c] * exp(static_cast<double>(m) - static_cast<double>(mx));
      }
      // The CPU's log_z = mx + float(log z), rounded as there.
      log_z_s = __fadd_rn(mx, static_cast<float>(log(z)));
      logz[ri] = log_z_s;
      out[ri].num_top = static_cast<int32_t>(min64(n, V));
    }
    __syncthreads();
  }
  const int total = nchunks * n;
  Pick last{INFINITY, -1};
  for (int r = 0; r < n; ++r) {
    Pick best{0.0f, kNone};
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const Pick x = cand[(base + i / n) * stride + i % n];
      if (before(last, x) && before(x, best)) best = x;
    }
    best = block_best(best, red);
    if (threadIdx.x == 0) {
      if constexpr (kStats) {
        if (r < V) {
          out[ri].top_ids[r] = best.id;
          out[ri].top_logprobs[r] = __fsub_rn(best.v, log_z_s);
        }
      } else {
        out[ri].token = best.id == kNone ? 0 : best.id;  // all NaN: std::max_element's 0
      }
    }
    last = best;
  }
}

// ---- 2: the edits ------------------------------------------------------------------------------

__global__ void apply_edits(float* logits, int64_t V, const SampleEdit* __restrict__ edits, int n,
                            const float* __restrict__ biases, float* raw) {
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    const SampleEdit ed = edits[e];
    float* p = logits + static_cast<int64_t>(ed.row) * V + ed.id;
    float l = *p;
    raw[e] = l;
    for (int b = ed.bias_begin; b < ed.bias_end; ++b) l = __fadd_rn(l, biases[b]);
    if (ed.flags & launch::kEditRepetition)
      l = l > 0.0f ? __fdiv_rn(l, ed.repetition) : __fmul_rn(l, ed.repetition);
    if (ed.flags & launch::kEditPenalty) l = __fsub_rn(l, ed.penalty);
    if (ed.flags & launch::kEditMask) l = -INFINITY;
    *p = l;
  }
}

// ---- 4: sampled rows ---------------------------------------------------------------------------

// Sort inputs of group row j (sampled[j]): its processed logits, packed, and ids 0..V-1.
__global__ void prepare_sort(const float* __restrict__ logits, int64_t V,
                             const SampleRow* __restrict__ rows,
                             const int32_t* __restrict__ sampled, float* keys, int32_t* ids) {
  const int j = blockIdx.y;
  const float* src = logits + static_cast<int64_t>(rows[sampled[j]].row) * V;
  const int64_t base = static_cast<int64_t>(j) * V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < V;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ids[base + i] = static_cast<int32_t>(i);
    keys[base + i] = src[i];
  }
}

struct RowView {
  const float* keys;  // sorted processed logits, descending
  int64_t keep;       // the top-k prefix
  double mx, temp;
};

__device__ __forceinline__ RowView row_view(const SampleRow& rp, const float* keys_sorted, int j,
                                            int64_t V) {
  RowView v;
  v.keys = keys_sorted + static_cast<int64_t>(j) * V;
  v.keep = rp.top_k > 0 && rp.top_k < V ? rp.top_k : V;
  v.mx = static_cast<double>(v.keys[0]);
  v.temp = static_cast<double>(rp.temperature);
  return v;
}

// The CPU's unnormalised probability: exp((double(l) - mx) / T).
__device__ __forceinline__ double weight(const RowView& v, int64_t i) {
  return exp(__ddiv_rn(static_cast<double>(v.keys[i]) - v.mx, v.temp));
}

// Sum of a block of values, sequentially in order (thread 0), from `parts` staged in shared
// memory: the same bits in every kernel that calls it. Contains __syncthreads.
__device__ __forceinline__ double ordered_sum(const double* parts, int n, double* smem) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = parts[i];
  __syncthreads();
  __shared__ double total;
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += smem[i];
    total = s;
  }
  __syncthreads();
  return total;
}

using BlockScanD = cub::BlockScan<double, kScanThreads>;

// The block scan of chunk c: thread t's entries lo + t * kScanItems + q get local[q] = the sum
// of p_i from the chunk's start through that entry (p_i = 0 past `keep`); returns the chunk's
// total (the last entry's local sum, the same bits). `ge` counts entries below `keep` with
// p_i >= thr. Contains __syncthreads.
__device__ __forceinline__ double chunk_scan(const RowView& v, int64_t keep, double z, int c,
                                             double thr, double (&local)[kScanItems], int* ge,
                                             typename BlockScanD::TempStorage& tmp,
                                             double* last_s) {
  const int64_t lo = static_cast<int64_t>(c) * kScanChunk + threadIdx.x * kScanItems;
  double acc = 0.0;
  int count = 0;
#pragma unroll
  for (int q = 0; q < kScanItems; ++q) {
    const int64_t i = lo + q;
    double p = 0.0;
    if (i < keep) {
      p = __ddiv_rn(weight(v, i), z);
      count += p >= thr;
    }
    acc += p;
    local[q] = acc;
  }
  double excl;
  BlockScanD(tmp).ExclusiveSum(acc, excl);
#pragma unroll
  for (int q = 0; q < kScanItems; ++q) local[q] = excl + local[q];
  if (ge) *ge = count;
  if (threadIdx.x == blockDim.x - 1) *last_s = local[kScanItems - 1];
  __syncthreads();
  return *last_s;
}

// The first entry of chunk c (below `limit`) whose cumulative sum base + local passes `target`
// (>= when !strict, > when strict), or -1. Contains __syncthreads.
__device__ __forceinline__ int64_t chunk_find(const RowView& v, int64_t keep, double z, int c,
                                              double base, double target, bool strict,
                                              int64_t limit, typename BlockScanD::TempStorage& tmp,
                                              double* last_s, double* cum_at, int64_t at) {
  __shared__ unsigned long long first;
  double local[kScanItems];
  if (threadIdx.x == 0) first = ULLONG_MAX;
  chunk_scan(v, keep, z, c, 0.0, local, nullptr, tmp, last_s);
  const int64_t lo = static_cast<int64_t>(c) * kScanChunk + threadIdx.x * kScanItems;
#pragma unroll
  for (int q = 0; q < kScanItems; ++q) {
    const int64_t i = lo + q;
    const double cum = base + local[q];
    if (i == at && cum_at) *cum_at = cum;
    if (i < limit && (strict ? target < cum : cum >= target)) {
      atomicMin(&first, static_cast<unsigned long long>(i));
      break;
    }
  }
  __syncthreads();
  const unsigned long long f = first;
  __syncthreads();
  return f == ULLONG_MAX ? -1 : static_cast<int64_t>(f);
}

// Block (c, j): zpart[j * nchunks + c] = sum of e_i over chunk c of the kept prefix.
__global__ void __launch_bounds__(kScanThreads)
    samp_z(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
           const float* __restrict__ keys_sorted, int nchunks, double* zpart) {
  __shared__ double red[32];
  const int j = blockIdx.y, c = blockIdx.x;
  const RowView v = row_view(rows[sampled[j]], keys_sorted, j, V);
  const int64_t lo = static_cast<int64_t>(c) * kScanChunk;
  double s = 0.0;
  if (lo < v.keep) {
    const int64_t hi = min64(lo + kScanChunk, v.keep);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += weight(v, i);
  }
  s = block_sum_d(s, red);
  if (threadIdx.x == 0) zpart[static_cast<int64_t>(j) * nchunks + c] = s;
}

// Block (c, j): chunk c's scanned total of p_i -> ppart, and how many p_i >= the min-p threshold
// -> cnt.
__global__ void __launch_bounds__(kScanThreads)
    samp_scan(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
              const float* __restrict__ keys_sorted, int nchunks, const double* __restrict__ zpart,
              double* ppart, int* cnt) {
  __shared__ double parts[kMaxScanChunks];
  __shared__ typename BlockScanD::TempStorage tmp;
  __shared__ double last_s;
  __shared__ int red[32];
  const int j = blockIdx.y, c = blockIdx.x;
  const SampleRow rp = rows[sampled[j]];
  const RowView v = row_view(rp, keys_sorted, j, V);
  const int64_t part = static_cast<int64_t>(j) * nchunks + c;
  if (static_cast<int64_t>(c) * kScanChunk >= v.keep) {
    if (threadIdx.x == 0) {
      ppart[part] = 0.0;
      cnt[part] = 0;
    }
    return;
  }
  const double z = ordered_sum(zpart + static_cast<int64_t>(j) * nchunks, nchunks, parts);
  // The CPU's threshold min_p * prob[0], prob[0] = exp(0) / z.
  const double thr = rp.min_p > 0.0f ? __dmul_rn(static_cast<double>(rp.min_p), 1.0 / z) : 0.0;
  double local[kScanItems];
  int ge = 0;
  const double total = chunk_scan(v, v.keep, z, c, thr, local, &ge, tmp, &last_s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ge += __shfl_xor_sync(kFull, ge, o);
  if (lane == 0) red[warp] = ge;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int w = 0; w < (kScanThreads >> 5); ++w) s += red[w];
    ppart[part] = total;
    cnt[part] = s;
  }
}

// Block j: the cuts and the pick of sampled row j.
__global__ void __launch_bounds__(kScanThreads)
    samp_pick(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
              const float* __restrict__ keys_sorted, const int32_t* __restrict__ ids_sorted,
              int nchunks, const double* __restrict__ zpart, const double* __restrict__ ppart,
              const int* __restrict__ cnt, SampleOut* out) {
  __shared__ double parts[kMaxScanChunks];
  __shared__ double prefix[kMaxScanChunks + 1];  // prefix[c]: sum of the chunk totals before c
  __shared__ typename BlockScanD::TempStorage tmp;
  __shared__ double last_s, cum_s;
  __shared__ int count_s;
  const int j = blockIdx.x;
  const int ri = sampled[j];
  const SampleRow rp = rows[ri];
  const RowView v = row_view(rp, keys_sorted, j, V);
  const int kchunks = static_cast<int>(ceil_div(v.keep, kScanChunk));
  const double z = ordered_sum(zpart + static_cast<int64_t>(j) * nchunks, nchunks, parts);
  __syncthreads();  // parts is reused below
  const int64_t pbase = static_cast<int64_t>(j) * nchunks;
  for (int c = threadIdx.x; c < kchunks; c += blockDim.x) parts[c] = ppart[pbase + c];
  if (threadIdx.x == 0) count_s = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int c = 0; c < kchunks; ++c) {
      prefix[c] = s;
      s += parts[c];
    }
    prefix[kchunks] = s;
  }
  if (rp.min_p > 0.0f) {
    int s = 0;
    for (int c = threadIdx.x; c < kchunks; c += blockDim.x) s += cnt[pbase + c];
    atomicAdd(&count_s, s);
  }
  __syncthreads();

  // top-p: the shortest prefix whose cumulative probability reaches top_p.
  int64_t keep = v.keep;
  if (rp.top_p < 1.0f) {
    const double target = static_cast<double>(rp.top_p);
    int c = 0;
    while (c < kchunks && !(prefix[c + 1] >= target)) ++c;
    if (c < kchunks) {
      const int64_t i =
          chunk_find(v, v.keep, z, c, prefix[c], target, false, v.keep, tmp, &last_s, nullptr, -1);
      if (i >= 0) keep = i + 1;
    }
  }
  // min-p: p_i falls along the sorted order, so the entries at or above the threshold are a
  // prefix (the first always is).
  if (rp.min_p > 0.0f) keep = max64(1, min64(keep, count_s));
  // The kept total: the cumulative sum at the last kept entry.
  const int cl = static_cast<int>((keep - 1) / kScanChunk);
  chunk_find(v, v.keep, z, cl, prefix[cl], 0.0, false, 0, tmp, &last_s, &cum_s, keep - 1);
  __syncthreads();
  const double total = cum_s;
  // Inverse CDF: the first kept entry with u * total < cum_i (the last kept one otherwise).
  const double target = __dmul_rn(rp.u, total);
  int64_t pick = -1;
  int c = 0;
  while (c < cl && !(target < prefix[c + 1])) ++c;
  pick = chunk_find(v, v.keep, z, c, prefix[c], target, true, keep, tmp, &last_s, nullptr, -1);
  if (pick < 0) pick = keep - 1;
  if (threadIdx.x == 0) out[ri].token = ids_sorted[static_cast<int64_t>(j) * V + pick];
}

// ---- 5: the chosen token's raw logprob ---------------------------------------------------------

// One warp per row: the raw logit is the edit's saved value when the token was edited.
__global__ void finish_logprobs(const float* __restrict__ logits, int64_t V,
                                const SampleRow* __restrict__ rows,
                                const int32_t* __restrict__ list,
                                const SampleEdit* __restrict__ edits, const float* __restrict__ raw,
                                const float* __restrict__ logz, SampleOut* out) {
  const int ri = list[blockIdx.x];
  const SampleRow rp = rows[ri];
  const int32_t token = out[ri].token;
  int found = -1;
  for (int e = rp.edit_begin + static_cast<int>(threadIdx.x); e < rp.edit_end; e += 32)
    if (edits[e].id == token) found = e;  // at most one edit per id
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) found = max(found, __shfl_xor_sync(kFull, found, o));
  if (threadIdx.x == 0) {
    const float l = found >= 0 ? raw[found] : logits[static_cast<int64_t>(rp.row) * V + token];
    out[ri].logprob = __fsub_rn(l, logz[ri]);
  }
}

// ---- scratch -----------------------------------------------------------------------------------

struct Layout {
  size_t raw = 0, logz = 0, cand = 0, pmax = 0, psum = 0;
  size_t keys_c = 0, keys_s = 0, ids_c = 0, ids_s = 0, zpart = 0, ppart = 0, cnt = 0, cub = 0;
  size_t cub_bytes = 0, total = 0;
  int top_chunks = 0, scan_chunks = 0, group = 0, top_stride = 0;
  SampleSortPath path = SampleSortPath::kAuto;
};

SampleSortPath resolve(const SampleArgs& a, SampleSortPath path) {
  if (path != SampleSortPath::kAuto) return path;
  return a.num_sampled <= kPerRowSortMaxRows ? SampleSortPath::kPerRow : SampleSortPath::kSegmented;
}

size_t cub_temp_bytes(int64_t V, int group, SampleSortPath path) {
  size_t bytes = 0;
  if (group == 0) return 0;
  const int n = static_cast<int>(V);
  if (path == SampleSortPath::kPerRow) {
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, 32));
  } else {
    const int32_t* offs = nullptr;
    LOOM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n * group, group,
        offs, offs + 1, 0, 32));
  }
  return bytes;
}

Layout layout(const SampleArgs& a, SampleSortPath path) {
  Layout l;
  const int64_t V = a.vocab;
  l.path = resolve(a, path);
  l.top_chunks = static_cast<int>(ceil_div(V, kTopChunk));
  l.scan_chunks = static_cast<int>(ceil_div(V, kScanChunk));
  l.group = std::min(a.num_sampled, launch::kSampleSortGroup);
  l.top_stride = std::max(1, a.max_top);
  const int64_t top_rows = std::max(a.num_with_logprobs, a.num_greedy);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.raw = take(sizeof(float) * a.num_edits);
  l.logz = take(sizeof(float) * a.num_rows);
  l.cand = take(sizeof(Pick) * top_rows * l.top_chunks * l.top_stride);
  l.pmax = take(sizeof(float) * a.num_with_logprobs * l.top_chunks);
  l.psum = take(sizeof(double) * a.num_with_logprobs * l.top_chunks);
  const size_t g = static_cast<size_t>(l.group) * V;
  l.keys_c = take(sizeof(float) * g);
  l.keys_s = take(sizeof(float) * g);
  l.ids_c = take(sizeof(int32_t) * g);
  l.ids_s = take(sizeof(int32_t) * g);
  l.zpart = take(sizeof(double) * l.group * l.scan_chunks);
  l.ppart = take(sizeof(double) * l.group * l.scan_chunks);
  l.cnt = take(sizeof(int) * l.group * l.scan_chunks);
  l.cub_bytes = cub_temp_bytes(V, l.group, l.path);
  l.cub = take(l.cub_bytes);
  l.total = off;
  return l;
}

template <typename T>
T* at(void* scratch, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(scratch) + off);
}

}  // namespace

namespace launch {

const char* sample_sort_path_name(SampleSortPath path) {
  switch (path) {
    case SampleSortPath::kAuto:
      return "auto";
    case SampleSortPath::kSegmented:
      return "segmented";
    case SampleSortPath::kPerRow:
      return "per_row";
  }
  return "?";
}

size_t sample_scratch_bytes(const SampleArgs& a, SampleSortPath path) {
  return layout(a, path).total;
}

void sample(cudaStream_t stream, const SampleArgs& a, SampleSortPath path, void* scratch) {
  if (a.num_rows == 0) return;
  const Layout l = layout(a, path);
  const int64_t V = a.vocab;
  float* raw = at<float>(scratch, l.raw);
  float* logz = at<float>(scratch, l.logz);
  Pick* cand = at<Pick>(scratch, l.cand);
  float* pmax = at<float>(scratch, l.pmax);
  double* psum = at<double>(scratch, l.psum);

  if (a.num_with_logprobs > 0) {
    top_partial<true><<<dim3(l.top_chunks, a.num_with_logprobs), kTopThreads, 0, stream>>>(
        a.logits, V, a.rows, a.with_logprobs, l.top_chunks, l.top_stride, cand, pmax, psum);
    LOOM_CUDA_CHECK_LAUNCH();
    top_final<true><<<a.num_with_logprobs, kTopThreads, 0, stream>>>(
        V, a.rows, a.with_logprobs, l.top_chunks, l.top_stride, cand, pmax, psum, logz, a.out);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (a.num_edits > 0) {
    apply_edits<<<dev::grid_for(a.num_edits, 256), 256, 0, stream>>>(a.logits, V, a.edits,
                                                                     a.num_edits, a.biases, raw);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (a.num_greedy > 0) {
    top_partial<false><<<dim3(l.top_chunks, a.num_greedy), kTopThreads, 0, stream>>>(
        a.logits, V, a.rows, a.greedy, l.top_chunks, l.top_stride, cand, nullptr, nullptr);
    LOOM_CUDA_CHECK_LAUNCH();
    top_final<false><<<a.num_greedy, kTopThreads, 0, stream>>>(
        V, a.rows, a.greedy, l.top_chunks, l.top_stride, cand, nullptr, nullptr, logz, a.out);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  float* keys_c = at<float>(scratch, l.keys_c);
  float* keys_s = at<float>(scratch, l.keys_s);
  int32_t* ids_c = at<int32_t>(scratch, l.ids_c);
  int32_t* ids_s = at<int32_t>(scratch, l.ids_s);
  double* zpart = at<double>(scratch, l.zpart);
  double* ppart = at<double>(scratch, l.ppart);
  int* cnt = at<int>(scratch, l.cnt);
  void* cub_tmp = at<void>(scratch, l.cub);
  const bool segmented = l.path == SampleSortPath::kSegmented;
  for (int g0 = 0; g0 < a.num_sampled; g0 += l.group) {
    const int gn = std::min(l.group, a.num_sampled - g0);
    const int32_t* sampled = a.sampled + g0;
    const unsigned xblocks = static_cast<unsigned>(min64(ceil_div(V, 1024), 512));
    prepare_sort<<<dim3(xblocks, gn), 1024, 0, stream>>>(a.logits, V, a.rows, sampled, keys_c,
                                                         ids_c);
    LOOM_CUDA_CHECK_LAUNCH();
    size_t bytes = l.cub_bytes;
    if (segmented) {
      LOOM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
          cub_tmp, bytes, keys_c, keys_s, ids_c, ids_s, static_cast<int>(V * gn), gn,
          a.segment_offsets, a.segment_offsets + 1, 0, 32, stream));
    } else {
      for (int j = 0; j < gn; ++j) {
        LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
            cub_tmp, bytes, keys_c + static_cast<int64_t>(j) * V,
            keys_s + static_cast<int64_t>(j) * V, ids_c + static_cast<int64_t>(j) * V,
            ids_s + static_cast<int64_t>(j) * V, static_cast<int>(V), 0, 32, stream));
      }
    }
    samp_z<<<dim3(l.scan_chunks, gn), kScanThreads, 0, stream>>>(V, a.rows, sampled, keys_s,
                                                                 l.scan_chunks, zpart);
    LOOM_CUDA_CHECK_LAUNCH();
    samp_scan<<<dim3(l.scan_chunks, gn), kScanThreads, 0, stream>>>(
        V, a.rows, sampled, keys_s, l.scan_chunks, zpart, ppart, cnt);
    LOOM_CUDA_CHECK_LAUNCH();
    samp_pick<<<gn, kScanThreads, 0, stream>>>(V, a.rows, sampled, keys_s, ids_s, l.scan_chunks,
                                               zpart, ppart, cnt, a.out);
    LOOM_CUDA_CHECK_LAUNCH();
  }
  if (a.num_with_logprobs > 0) {
    finish_logprobs<<<a.num_with_logprobs, 32, 0, stream>>>(a.logits, V, a.rows, a.with_logprobs,
                                                            a.edits, raw, logz, a.out);
    LOOM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace launch
}  // namespace loom::cuda
