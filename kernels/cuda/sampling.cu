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
//   4. sampled rows, kSampleSortGroup at a time. The full sort (paths segmented and per_row, and
//      the select path's fallback): the row's (processed logit, id) pairs sorted by
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
// simple way to get it, but at V = 163840 on an H200 it costs ~120 us for one row (CUB's radix
// sort over the whole GPU) and ~1.4 ms for 64 rows (segmented, one block a row), against ~28 us
// and ~55 us for greedy rows. The select path (the default; section "4 (select path)" below)
// sorts only each row's top few thousand entries, found by a radix select, sums z and the tail
// mass unsorted, and sorts a whole row only when its cut or pick falls past those
// (tests/gpu/sampling_cuda_bench.cc measures every path; bench/results/gpu-h200.md).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cub/cub.cuh>
#include <vector>

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

// The full sort by CUB's per-row radix sort (each over the whole GPU: ~90 us a row at V = 163840
// on an H200) up to this many rows, the segmented one (one block per row: ~1 ms for 1 to 64
// rows) past it: the choice of path "auto" before the select path, and now of its fallback.
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
                             const int32_t* __restrict__ sampled, const int* __restrict__ only,
                             float* keys, int32_t* ids) {
  const int j = blockIdx.y;
  if (only && !only[j]) return;  // a row the select path finished: its segment is empty
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

// Sum of e_i over sorted chunk c, entries below `keep`: thread t adds entries lo + t, lo + t +
// blockDim.x, ..., then a fixed tree (the select path calls it too, so both get the same z).
// Contains __syncthreads.
__device__ __forceinline__ double chunk_z(const RowView& v, int64_t keep, int c, double* red) {
  const int64_t lo = static_cast<int64_t>(c) * kScanChunk;
  double s = 0.0;
  if (lo < keep) {
    const int64_t hi = min64(lo + kScanChunk, keep);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += weight(v, i);
  }
  return block_sum_d(s, red);
}

// Block (c, j): zpart[j * nchunks + c] = sum of e_i over chunk c of the kept prefix.
__global__ void __launch_bounds__(kScanThreads)
    samp_z(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
           const float* __restrict__ keys_sorted, int nchunks, const int* __restrict__ only,
           double* zpart) {
  __shared__ double red[32];
  const int j = blockIdx.y, c = blockIdx.x;
  if (only && !only[j]) return;
  const RowView v = row_view(rows[sampled[j]], keys_sorted, j, V);
  const double s = chunk_z(v, v.keep, c, red);
  if (threadIdx.x == 0) zpart[static_cast<int64_t>(j) * nchunks + c] = s;
}

// Block (c, j): chunk c's scanned total of p_i -> ppart, and how many p_i >= the min-p threshold
// -> cnt.
__global__ void __launch_bounds__(kScanThreads)
    samp_scan(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
              const float* __restrict__ keys_sorted, int nchunks, const double* __restrict__ zpart,
              const int* __restrict__ only, double* ppart, int* cnt) {
  __shared__ double parts[kMaxScanChunks];
  __shared__ typename BlockScanD::TempStorage tmp;
  __shared__ double last_s;
  __shared__ int red[32];
  const int j = blockIdx.y, c = blockIdx.x;
  if (only && !only[j]) return;
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
              const int* __restrict__ cnt, const int* __restrict__ only, SampleOut* out) {
  __shared__ double parts[kMaxScanChunks];
  __shared__ double prefix[kMaxScanChunks + 1];  // prefix[c]: sum of the chunk totals before c
  __shared__ typename BlockScanD::TempStorage tmp;
  __shared__ double last_s, cum_s;
  __shared__ int count_s;
  const int j = blockIdx.x;
  if (only && !only[j]) return;
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
  if (threadIdx.x == 0) {
    out[ri].token = ids_sorted[static_cast<int64_t>(j) * V + pick];
    out[ri].sorted_all = 1;
  }
}

// ---- 4 (select path): sampled rows without the full sort ---------------------------------------
//
// A row's candidates are its `target` first entries in the sorted order (target = the top-k when
// top_k <= kSelMax, else kSelTarget), found by a radix select on the logits' order-preserving bits
// (three histogram passes of 11, 11 and 10 bits: the exact 32-bit threshold t and how many of the
// entries equal to t are needed), then collected (every entry above t, and every entry equal to t
// when that makes at most kSelMax) and sorted in one block by the composite key (bits, then the
// inverted id), so that ties come out by ascending id, as the CPU orders them. The collected set
// is always a prefix of the CPU's sorted order. The pick block then runs the full-sort path's
// arithmetic over that prefix (the same chunk_z, chunk_scan and chunk_find code):
//   - a top-k row whose kept prefix was collected whole ("complete") gets the full-sort path's
//     z, cuts and pick bit for bit;
//   - a row without top-k sums z over all V entries unsorted (sel_collect, one fixed tree per
//     block, the blocks' sums in order), which differs from the sorted sum in the last bits only
//     (the CPU's sequential sum differs from both by as much); the entries that were not collected
//     add their mass unsorted to the kept total when neither top-p nor min-p cuts.
// A row whose top-p or min-p cut, or whose pick, falls past its candidates (and every row with
// kSelMax < top_k < V, and every row whose tie at t would overflow kSelMax with nothing above it)
// is flagged; the full-sort path then runs for the flagged rows only: the host downloads the
// flags (one wait per group), launches nothing more when none is set, CUB's per-row sorts for up
// to kPerRowSortMaxRows flagged rows, and the segmented sort (empty segments for the rows
// already finished) for more.

constexpr int kSelThreads = kScanThreads;  // the pick block runs the scan code
constexpr int kSelItems = 16;
constexpr int kSelMax = kSelThreads * kSelItems;  // candidates sorted at most
constexpr int kSelSmallItems = 4;                 // a smaller sort when few were collected
constexpr int kSelTarget = 3072;  // candidates wanted (the slack up to kSelMax takes ties at t)
constexpr int kSelBins = 2048;    // 11-bit digits
constexpr int kSelIdBits = 21;    // ids < kSampleMaxVocab = 2^21
static_assert(launch::kSampleMaxVocab <= (int64_t{1} << kSelIdBits));
constexpr int kSelMinSpan = 2048;       // entries per histogram block, at least
constexpr int kSelBlocksWanted = 1024;  // histogram blocks per group, about

__host__ __device__ constexpr int sel_shift(int level) {
  return level == 0 ? 21 : level == 1 ? 10 : 0;
}
__host__ __device__ constexpr int sel_bins(int level) { return level == 2 ? 1024 : kSelBins; }

// Per sampled row of a group, zeroed before the group.
struct SelState {
  unsigned hist[3][kSelBins];
  unsigned max_bits;  // the row's largest order bits
  unsigned count;     // candidates collected
};

// Order-preserving bits: a > b as floats iff bits(a) > bits(b); -0 and +0 get the same bits (the
// CPU's comparison treats them as equal, and so does CUB's sort).
__device__ __forceinline__ unsigned order_bits(float f) {
  if (f == 0.0f) f = 0.0f;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_order_bits(unsigned o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

struct SelRow {
  int64_t keep;     // the top-k prefix (V when off)
  unsigned target;  // candidates to select
  bool eligible;    // false: kSelMax < top_k < V, the full sort from the start
  bool sum_all;     // no top-k over a row longer than kSelMax: z over all V entries, unsorted
};
__device__ __forceinline__ SelRow sel_row(const SampleRow& rp, int64_t V) {
  SelRow s;
  s.keep = rp.top_k > 0 && rp.top_k < V ? rp.top_k : V;
  s.eligible = s.keep <= kSelMax || s.keep == V;
  s.target = static_cast<unsigned>(s.keep <= kSelMax ? s.keep : kSelTarget);
  s.sum_all = s.keep == V && V > kSelMax;
  return s;
}

using BlockScanU = cub::BlockScan<unsigned, kSelThreads>;

// One radix-select step: in `hist` (nbins digits), the digit holding the need-th largest entry,
// and how many of that digit's entries are still needed. Bins are walked from the top digit down;
// thread t takes positions 8t..8t+7 of that walk. Every thread gets the results. Contains
// __syncthreads.
__device__ __forceinline__ void sel_descend(const unsigned* __restrict__ hist, int nbins,
                                            unsigned need, unsigned& digit, unsigned& left,
                                            typename BlockScanU::TempStorage& tmp,
                                            unsigned* shared2) {
  constexpr int kPer = kSelBins / kSelThreads;
  unsigned c[kPer], s = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int b = nbins - 1 - (static_cast<int>(threadIdx.x) * kPer + q);
    c[q] = b >= 0 ? hist[b] : 0u;
    s += c[q];
  }
  unsigned run;
  BlockScanU(tmp).ExclusiveSum(s, run);
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (run < need && need <= run + c[q]) {
      shared2[0] = static_cast<unsigned>(nbins - 1 - (static_cast<int>(threadIdx.x) * kPer + q));
      shared2[1] = need - run;
    }
    run += c[q];
  }
  __syncthreads();
  digit = shared2[0];
  left = shared2[1];
  __syncthreads();
}

// The digits of levels [0, levels): prefix holds them at their bit positions; need is how many
// entries of that prefix are still wanted. Contains __syncthreads.
__device__ __forceinline__ void sel_resolve(const SelState& st, int levels, unsigned target,
                                            unsigned& prefix, unsigned& need,
                                            typename BlockScanU::TempStorage& tmp,
                                            unsigned* shared2) {
  prefix = 0;
  need = target;
  for (int q = 0; q < levels; ++q) {
    unsigned d;
    sel_descend(st.hist[q], sel_bins(q), need, d, need, tmp, shared2);
    prefix |= d << sel_shift(q);
  }
}

// Block (c, j): the level-L histogram of entries [c * span, (c + 1) * span) of group row j that
// match the digits of the levels before; level 0 also takes the row's largest bits.
template <int L>
__global__ void __launch_bounds__(kSelThreads)
    sel_hist(const float* __restrict__ logits, int64_t V, const SampleRow* __restrict__ rows,
             const int32_t* __restrict__ sampled, int64_t span, SelState* st) {
  __shared__ unsigned h[kSelBins];
  __shared__ typename BlockScanU::TempStorage tmp;
  __shared__ unsigned shared2[2], mx_s;
  const int j = blockIdx.y, c = blockIdx.x;
  const SampleRow rp = rows[sampled[j]];
  const SelRow sr = sel_row(rp, V);
  if (!sr.eligible) return;
  for (int b = threadIdx.x; b < kSelBins; b += blockDim.x) h[b] = 0;
  if (threadIdx.x == 0) mx_s = 0;
  unsigned prefix = 0, need = 0;
  sel_resolve(st[j], L, sr.target, prefix, need, tmp, shared2);  // syncs
  __syncthreads();
  const int64_t lo = static_cast<int64_t>(c) * span, hi = min64(V, lo + span);
  const float* src = logits + static_cast<int64_t>(rp.row) * V;
  unsigned mo = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const unsigned o = order_bits(src[i]);
    if constexpr (L == 0) {
      mo = max(mo, o);
      atomicAdd(&h[o >> sel_shift(0)], 1u);
    } else {
      if ((o >> sel_shift(L - 1)) == (prefix >> sel_shift(L - 1)))
        atomicAdd(&h[(o >> sel_shift(L)) & (sel_bins(L) - 1)], 1u);
    }
  }
  if constexpr (L == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mo = max(mo, __shfl_xor_sync(kFull, mo, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&mx_s, mo);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < sel_bins(L); b += blockDim.x)
    if (h[b] != 0) atomicAdd(&st[j].hist[L][b], h[b]);
  if (L == 0 && threadIdx.x == 0) atomicMax(&st[j].max_bits, mx_s);
}

// Block (c, j): collects the candidates among entries [c * span, (c + 1) * span) of group row j
// into cand[j * kSelMax + ...] as composite keys (order bits << 21 | inverted id); sum_all rows
// also sum e_i over the block (zsel) and over its entries not collected (tail), one fixed tree.
__global__ void __launch_bounds__(kSelThreads)
    sel_collect(const float* __restrict__ logits, int64_t V, const SampleRow* __restrict__ rows,
                const int32_t* __restrict__ sampled, int64_t span, int nblk, SelState* st,
                unsigned long long* cand, double* zsel, double* tail) {
  __shared__ typename BlockScanU::TempStorage tmp;
  __shared__ unsigned shared2[2];
  __shared__ double red[32];
  const int j = blockIdx.y, c = blockIdx.x;
  const SampleRow rp = rows[sampled[j]];
  const SelRow sr = sel_row(rp, V);
  if (!sr.eligible) return;
  unsigned t = 0, need = 0;
  sel_resolve(st[j], 3, sr.target, t, need, tmp, shared2);
  const unsigned above = sr.target - need;
  const bool ties = above + st[j].hist[2][t & (sel_bins(2) - 1)] <= kSelMax;
  const int64_t lo = static_cast<int64_t>(c) * span, hi = min64(V, lo + span);
  const float* src = logits + static_cast<int64_t>(rp.row) * V;
  const double mx = static_cast<double>(from_order_bits(st[j].max_bits));
  const double temp = static_cast<double>(rp.temperature);
  unsigned long long* out = cand + static_cast<int64_t>(j) * kSelMax;
  double z = 0.0, rest = 0.0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float l = src[i];
    const unsigned o = order_bits(l);
    const bool take = o > t || (ties && o == t);
    if (take) {
      const unsigned at = atomicAdd(&st[j].count, 1u);
      out[at] =
          (static_cast<unsigned long long>(o) << kSelIdBits) |
          static_cast<unsigned long long>(((1u << kSelIdBits) - 1u) - static_cast<unsigned>(i));
    }
    if (sr.sum_all) {
      const double e = exp(__ddiv_rn(static_cast<double>(l) - mx, temp));
      z += e;
      if (!take) rest += e;
    }
  }
  if (!sr.sum_all) return;  // uniform over the block
  z = block_sum_d(z, red);
  rest = block_sum_d(rest, red);
  if (threadIdx.x == 0) {
    zsel[static_cast<int64_t>(j) * nblk + c] = z;
    tail[static_cast<int64_t>(j) * nblk + c] = rest;
  }
}

// Sorts n <= kThreads * kItems composite keys descending into vals/ids (entries >= n: padding).
template <int kItems, typename Sort>
__device__ __forceinline__ void sel_sort(const unsigned long long* __restrict__ keys, unsigned n,
                                         typename Sort::TempStorage& tmp, float* vals,
                                         int32_t* ids) {
  unsigned long long k[kItems];
#pragma unroll
  for (int q = 0; q < kItems; ++q) {
    const unsigned i = threadIdx.x * kItems + q;
    k[q] = i < n ? keys[i] : 0ull;
  }
  Sort(tmp).SortDescending(k, 0, 32 + kSelIdBits);
  __syncthreads();  // vals and ids share the sort's storage
#pragma unroll
  for (int q = 0; q < kItems; ++q) {
    const int i = threadIdx.x * kItems + q;
    vals[i] = from_order_bits(static_cast<unsigned>(k[q] >> kSelIdBits));
    ids[i] = static_cast<int32_t>(((1u << kSelIdBits) - 1u) -
                                  static_cast<unsigned>(k[q] & ((1ull << kSelIdBits) - 1ull)));
  }
  __syncthreads();
}

// Block j: sorts group row j's candidates and finishes the row as samp_z, samp_scan and samp_pick
// would over the same prefix, or flags it for the full sort (full[j] = 1 and a non-empty segment
// end; else full[j] = 0 and an empty segment).
__global__ void __launch_bounds__(kSelThreads)
    sel_pick(int64_t V, const SampleRow* __restrict__ rows, const int32_t* __restrict__ sampled,
             int nblk, const SelState* __restrict__ st, const unsigned long long* __restrict__ cand,
             const double* __restrict__ zsel, const double* __restrict__ tail, int* full,
             int32_t* seg_end, SampleOut* out) {
  using SortBig = cub::BlockRadixSort<unsigned long long, kSelThreads, kSelItems, cub::NullType, 6>;
  using SortSmall =
      cub::BlockRadixSort<unsigned long long, kSelThreads, kSelSmallItems, cub::NullType, 6>;
  constexpr int kMaxChunks = kSelMax / kScanChunk;
  __shared__ union {
    typename SortBig::TempStorage big;
    typename SortSmall::TempStorage small;
    struct {
      float vals[kSelMax];
      int32_t ids[kSelMax];
    } sorted;
  } sm;
  __shared__ typename BlockScanD::TempStorage tmp;
  __shared__ double red[32];
  __shared__ double parts[kMaxChunks], prefix[kMaxChunks + 1];
  __shared__ double last_s, cum_s, z_s, tail_s;
  __shared__ int count_s;
  const int j = blockIdx.x;
  const int ri = sampled[j];
  const SampleRow rp = rows[ri];
  const SelRow sr = sel_row(rp, V);
  // Decided uniformly over the block; false until the row is finished here.
  bool done = false;
  const unsigned n = sr.eligible ? st[j].count : 0u;
  const bool complete = sr.eligible && n >= sr.keep;
  if (n > 0 && (complete || sr.sum_all)) {
    if (n <= kSelThreads * kSelSmallItems)
      sel_sort<kSelSmallItems, SortSmall>(cand + static_cast<int64_t>(j) * kSelMax, n, sm.small,
                                          sm.sorted.vals, sm.sorted.ids);
    else
      sel_sort<kSelItems, SortBig>(cand + static_cast<int64_t>(j) * kSelMax, n, sm.big,
                                   sm.sorted.vals, sm.sorted.ids);
    RowView v;
    v.keys = sm.sorted.vals;
    v.keep = sr.keep;
    v.mx = static_cast<double>(sm.sorted.vals[0]);
    v.temp = static_cast<double>(rp.temperature);
    // Entries scanned: the kept prefix when complete, else every candidate.
    const int64_t scan_keep = complete ? sr.keep : static_cast<int64_t>(n);
    const int kchunks = static_cast<int>(ceil_div(scan_keep, kScanChunk));
    double z;
    if (complete) {
      // samp_z's sums over the same sorted entries, added in chunk order as ordered_sum does.
      double s = 0.0;
      for (int c = 0; c < kchunks; ++c) s += chunk_z(v, sr.keep, c, red);
      z = s;
    } else {
      if (threadIdx.x == 0) {
        double s = 0.0, r = 0.0;
        for (int c = 0; c < nblk; ++c) {
          s += zsel[static_cast<int64_t>(j) * nblk + c];
          r += tail[static_cast<int64_t>(j) * nblk + c];
        }
        z_s = s;
        tail_s = r;
      }
      __syncthreads();
      z = z_s;
    }
    // samp_scan over the scanned chunks: their totals, and how many p_i reach the min-p threshold.
    const double thr = rp.min_p > 0.0f ? __dmul_rn(static_cast<double>(rp.min_p), 1.0 / z) : 0.0;
    if (threadIdx.x == 0) count_s = 0;
    __syncthreads();
    for (int c = 0; c < kchunks; ++c) {
      double local[kScanItems];
      int ge = 0;
      const double total = chunk_scan(v, scan_keep, z, c, thr, local, &ge, tmp, &last_s);
      if (threadIdx.x == 0) parts[c] = total;
      if (ge) atomicAdd(&count_s, ge);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double s = 0.0;
      for (int c = 0; c < kchunks; ++c) {
        prefix[c] = s;
        s += parts[c];
      }
      prefix[kchunks] = s;
    }
    __syncthreads();
    // samp_pick's cuts. keep: the kept prefix once known; open: a cut may fall past the
    // candidates (only when not complete).
    int64_t keep = complete ? sr.keep : V;
    bool cut = complete;  // complete rows know every cut
    bool open = false;
    if (rp.top_p < 1.0f) {
      const double target = static_cast<double>(rp.top_p);
      int c = 0;
      while (c < kchunks && !(prefix[c + 1] >= target)) ++c;
      if (c < kchunks) {
        const int64_t i = chunk_find(v, scan_keep, z, c, prefix[c], target, false, scan_keep, tmp,
                                     &last_s, nullptr, -1);
        if (i >= 0) {
          keep = i + 1;
          cut = true;
        }
      }
      if (!cut) open = true;
    }
    if (rp.min_p > 0.0f) {
      if (complete || count_s < static_cast<int>(n)) {
        keep = max64(1, min64(keep, count_s));
        cut = true;
        open = false;  // the min-p cut is inside the candidates, below any open top-p cut
      } else if (!cut) {
        open = true;
      }
    }
    if (!open) {
      double total;
      int cl;
      if (cut) {  // the kept total: the cumulative sum at the last kept entry
        cl = static_cast<int>((keep - 1) / kScanChunk);
        chunk_find(v, scan_keep, z, cl, prefix[cl], 0.0, false, 0, tmp, &last_s, &cum_s, keep - 1);
        __syncthreads();
        total = cum_s;
      } else {  // no cut over all V: the candidates' sum plus the rest's mass, unsorted
        cl = kchunks - 1;
        total = prefix[kchunks] + __ddiv_rn(tail_s, z);
      }
      const double target = __dmul_rn(rp.u, total);
      if (cut || target < prefix[kchunks]) {
        int c = 0;
        while (c < cl && !(target < prefix[c + 1])) ++c;
        const int64_t limit = cut ? keep : scan_keep;
        int64_t pick = chunk_find(v, scan_keep, z, c, prefix[c], target, true, limit, tmp, &last_s,
                                  nullptr, -1);
        if (pick < 0 && cut) pick = keep - 1;
        if (pick >= 0) {
          done = true;
          if (threadIdx.x == 0) {
            out[ri].token = sm.sorted.ids[pick];
            out[ri].sorted_all = 0;
          }
        }
      }
    }
  }
  if (threadIdx.x == 0) {
    full[j] = done ? 0 : 1;
    seg_end[j] = static_cast<int32_t>((done ? j : j + 1) * V);
  }
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
  // The select path's (kSelect only).
  size_t sel_state = 0, sel_cand = 0, sel_z = 0, sel_tail = 0, sel_full = 0, sel_end = 0;
  size_t cub_bytes = 0, total = 0;
  int top_chunks = 0, scan_chunks = 0, group = 0, top_stride = 0, sel_max_blocks = 0;
  SampleSortPath path = SampleSortPath::kAuto;
};

SampleSortPath resolve(SampleSortPath path) {
  return path == SampleSortPath::kAuto ? SampleSortPath::kSelect : path;
}

// Histogram blocks per sampled row of a group of gn rows: about kSelBlocksWanted over the group,
// at least kSelMinSpan entries each.
int sel_blocks(int64_t V, int gn) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min(ceil_div(V, kSelMinSpan), ceil_div(kSelBlocksWanted, gn))));
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
  l.path = resolve(path);
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
  if (l.path == SampleSortPath::kSelect && l.group > 0) {
    l.sel_max_blocks = sel_blocks(V, 1);
    l.sel_state = take(sizeof(SelState) * l.group);
    l.sel_cand = take(sizeof(unsigned long long) * kSelMax * l.group);
    l.sel_z = take(sizeof(double) * l.sel_max_blocks * l.group);
    l.sel_tail = take(sizeof(double) * l.sel_max_blocks * l.group);
    l.sel_full = take(sizeof(int) * l.group);
    l.sel_end = take(sizeof(int32_t) * l.group);
  }
  // The select path's fallback is the segmented sort (over its flagged rows only).
  // The select path's fallback takes either full sort (sample() picks by the flagged rows).
  l.cub_bytes = l.path == SampleSortPath::kSelect
                    ? std::max(cub_temp_bytes(V, l.group, SampleSortPath::kSegmented),
                               cub_temp_bytes(V, l.group, SampleSortPath::kPerRow))
                    : cub_temp_bytes(V, l.group, l.path);
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
    case SampleSortPath::kSelect:
      return "select";
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
  const bool select = l.path == SampleSortPath::kSelect;
  std::vector<int> host_full;    // the select path's flags, downloaded
  std::vector<int> sorted_rows;  // group rows the full sort takes
  SelState* sel_state = at<SelState>(scratch, l.sel_state);
  unsigned long long* sel_cand = at<unsigned long long>(scratch, l.sel_cand);
  double* sel_z = at<double>(scratch, l.sel_z);
  double* sel_tail = at<double>(scratch, l.sel_tail);
  int* full = select ? at<int>(scratch, l.sel_full) : nullptr;  // nullptr: every row sorted
  int32_t* sel_end = at<int32_t>(scratch, l.sel_end);
  for (int g0 = 0; g0 < a.num_sampled; g0 += l.group) {
    const int gn = std::min(l.group, a.num_sampled - g0);
    const int32_t* sampled = a.sampled + g0;
    sorted_rows.clear();
    if (select) {
      const int nblk = sel_blocks(V, gn);
      const int64_t span = ceil_div(V, nblk);
      LOOM_CUDA_CHECK(cudaMemsetAsync(sel_state, 0, sizeof(SelState) * gn, stream));
      const dim3 grid(nblk, gn);
      sel_hist<0><<<grid, kSelThreads, 0, stream>>>(a.logits, V, a.rows, sampled, span, sel_state);
      LOOM_CUDA_CHECK_LAUNCH();
      sel_hist<1><<<grid, kSelThreads, 0, stream>>>(a.logits, V, a.rows, sampled, span, sel_state);
      LOOM_CUDA_CHECK_LAUNCH();
      sel_hist<2><<<grid, kSelThreads, 0, stream>>>(a.logits, V, a.rows, sampled, span, sel_state);
      LOOM_CUDA_CHECK_LAUNCH();
      sel_collect<<<grid, kSelThreads, 0, stream>>>(a.logits, V, a.rows, sampled, span, nblk,
                                                    sel_state, sel_cand, sel_z, sel_tail);
      LOOM_CUDA_CHECK_LAUNCH();
      sel_pick<<<gn, kSelThreads, 0, stream>>>(V, a.rows, sampled, nblk, sel_state, sel_cand, sel_z,
                                               sel_tail, full, sel_end, a.out);
      LOOM_CUDA_CHECK_LAUNCH();
      // Which rows need the full sort: one small download (a wait), so that a group where none
      // does launches nothing more, and a few take the per-row sorts (~100 us a row) rather
      // than the segmented one (~1 ms whatever the number of rows).
      host_full.resize(gn);
      LOOM_CUDA_CHECK(cudaMemcpyAsync(host_full.data(), full, sizeof(int) * gn,
                                      cudaMemcpyDeviceToHost, stream));
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
      for (int j = 0; j < gn; ++j)
        if (host_full[j] != 0) sorted_rows.push_back(j);
      if (sorted_rows.empty()) continue;
    } else {
      for (int j = 0; j < gn; ++j) sorted_rows.push_back(j);
    }
    const bool segmented = select ? static_cast<int>(sorted_rows.size()) > kPerRowSortMaxRows
                                  : l.path == SampleSortPath::kSegmented;
    // The full sort: every row, or (select) the flagged rows, whose segments alone are non-empty.
    const unsigned xblocks = static_cast<unsigned>(min64(ceil_div(V, 1024), 512));
    prepare_sort<<<dim3(xblocks, gn), 1024, 0, stream>>>(a.logits, V, a.rows, sampled, full, keys_c,
                                                         ids_c);
    LOOM_CUDA_CHECK_LAUNCH();
    size_t bytes = l.cub_bytes;
    if (segmented) {
      LOOM_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
          cub_tmp, bytes, keys_c, keys_s, ids_c, ids_s, static_cast<int>(V * gn), gn,
          a.segment_offsets, select ? sel_end : a.segment_offsets + 1, 0, 32, stream));
    } else {
      for (int j : sorted_rows) {
        LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
            cub_tmp, bytes, keys_c + static_cast<int64_t>(j) * V,
            keys_s + static_cast<int64_t>(j) * V, ids_c + static_cast<int64_t>(j) * V,
            ids_s + static_cast<int64_t>(j) * V, static_cast<int>(V), 0, 32, stream));
      }
    }
    samp_z<<<dim3(l.scan_chunks, gn), kScanThreads, 0, stream>>>(V, a.rows, sampled, keys_s,
                                                                 l.scan_chunks, full, zpart);
    LOOM_CUDA_CHECK_LAUNCH();
    samp_scan<<<dim3(l.scan_chunks, gn), kScanThreads, 0, stream>>>(
        V, a.rows, sampled, keys_s, l.scan_chunks, zpart, full, ppart, cnt);
    LOOM_CUDA_CHECK_LAUNCH();
    samp_pick<<<gn, kScanThreads, 0, stream>>>(V, a.rows, sampled, keys_s, ids_s, l.scan_chunks,
                                               zpart, ppart, cnt, full, a.out);
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
