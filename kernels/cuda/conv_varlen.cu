// causal_conv1d_varlen on the GPU: one launch over the whole varlen batch, no host loop over
// sequences and no copy back of cu_seqlens.
//
// Grid: (B owner blocks, then chunks of L consecutive rows of x) x (blocks of 128 * V channels);
// a thread takes V adjacent channels.
//  - Owner block b takes rows t < W-1 of sequence b, the only rows whose window reaches into the
//    old state (row t reads xpad rows t .. t+W-1 of concat(state, x), and xpad rows < W-1 are the
//    state), then writes the new state: the last W-1 rows of xpad, which for a sequence shorter
//    than W-1 include old state rows (it loads all of them before storing any). Its bounds
//    (cu_seqlens[b], cu_seqlens[b + 1]) and its slot need no search and are loaded together.
//  - A chunk block finds the sequence of its first row (the guess of equal lengths, else a
//    binary search in cu_seqlens) and walks its rows in order, advancing through cu_seqlens at
//    sequence ends (empty sequences included) and skipping every sequence's rows t < W-1; it
//    reads x only. Along a run of rows of one sequence it keeps the last W inputs of each channel
//    in registers (a sliding window), so x is read once but for W-1 rows at each chunk start; the
//    loads of 4 rows are issued together.
// Why one launch is race-free: a sequence's slot is read and written by the threads of its owner
// block alone, each thread for its own channels, reads first (slots are distinct across
// sequences); output rows are split between owners (t < W-1) and chunks (t >= W-1) without
// overlap. Sequences of no rows keep their state untouched, as on the CPU. Keeping the owners'
// work out of the chunks also keeps a chunk full of single-token sequences (a decode batch, or
// the decodes beside a prefill) from chaining their state loads one after another in one thread.
//
// Arithmetic: out = act(sum_j w[c, j] * xpad[t + j]) as fmaf(w_j, x_j, acc) from acc = 0, j in
// order: the same operations as causal_conv1d_forward's and causal_conv1d_step's CUDA kernels
// (kernels/cuda/conv.cu), so a sequence gets bit-identical outputs and state in the varlen call
// and alone. The state is copied, never computed.
//
// Dtypes: x, out and the pool are each f32 or bf16 (template parameters). Loads widen bf16
// exactly, the arithmetic is f32, and stores to bf16 round to nearest even; the state rows of a
// bf16 x are its own bf16 values, so a bf16 pool loses nothing then.
//
// A slot outside [0, num_slots) (a caller bug the CPU twin aborts on) reads as NaN and is not
// written; cu_seqlens is trusted to be 0 first, N last and non-decreasing (the host cannot check
// it without a copy back); rows are never read or written outside [0, N) either way.
#include <cuda_bf16.h>

#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/varlen_launch.h"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;
constexpr int kUnroll = 4;  // rows whose loads are in flight together

template <int V>
struct Vec {
  float v[V];
};

// Loads V adjacent elements of f32 or bf16 memory as floats (bf16 widens exactly); four at once
// move 16 bytes of f32 or 8 of bf16 in one access.
template <int V, class T>
__device__ __forceinline__ Vec<V> load(const T* p) {
  Vec<V> r;
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    r.v[0] = f.x;
    r.v[1] = f.y;
    r.v[2] = f.z;
    r.v[3] = f.w;
  } else if constexpr (V == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    r.v[0] = a.x;
    r.v[1] = a.y;
    r.v[2] = b.x;
    r.v[3] = b.y;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        r.v[i] = p[i];
      } else {
        r.v[i] = __bfloat162float(p[i]);
      }
    }
  }
  return r;
}

// Stores V floats to f32 or bf16 memory (bf16: each rounded to nearest even).
template <int V, class T>
__device__ __forceinline__ void store(T* p, const Vec<V>& a) {
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]);
  } else if constexpr (V == 4) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a.v[0], a.v[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(a.v[2], a.v[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        p[i] = a.v[i];
      } else {
        p[i] = __float2bfloat16_rn(a.v[i]);
      }
    }
  }
}

template <int V>
__device__ __forceinline__ Vec<V> nans() {
  Vec<V> r;
#pragma unroll
  for (int i = 0; i < V; ++i) r.v[i] = __int_as_float(0x7fc00000);
  return r;
}

// KW > 0: the width at compile time (register window); KW == 0: any width W (each xpad row read
// from memory, W loads per output row; same arithmetic). TX, TO, TS: the element types (float or
// bf16) of x, out and the state pool; the arithmetic is f32 either way.
template <int KW, int V, class TX, class TO, class TS>
__global__ void __launch_bounds__(kThreads)
    conv_varlen_kernel(const TX* __restrict__ x, const float* __restrict__ w, TS* __restrict__ pool,
                       const int32_t* __restrict__ slots, const int64_t* __restrict__ cu,
                       TO* __restrict__ out, int64_t N, int64_t C, int w_runtime, int64_t B,
                       int64_t num_slots, int64_t L, bool silu) {
  const int W = KW > 0 ? KW : w_runtime;
  const int P = W - 1;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * V;
  if (c >= C) return;

  float wr[KW > 0 ? KW : 1][V];
  if constexpr (KW > 0) {
#pragma unroll
    for (int j = 0; j < KW; ++j)
#pragma unroll
      for (int i = 0; i < V; ++i) wr[j][i] = w[(c + i) * KW + j];
  }

  const auto emit = [&](int64_t row, const Vec<V>& acc) {
    Vec<V> o;
#pragma unroll
    for (int i = 0; i < V; ++i) o.v[i] = silu ? dev::silu(acc.v[i]) : acc.v[i];
    store<V>(out + row * C + c, o);
  };
  // One output row from the window win[0 .. KW-2] (xpad rows t .. t+KW-2) and xv (row t+KW-1),
  // then the window moves down a row.
  const auto step = [&](Vec<V>(&win)[KW > 0 ? KW : 1], int64_t row, const Vec<V>& xv) {
    win[KW - 1] = xv;
    Vec<V> acc;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float a = 0.0f;
#pragma unroll
      for (int j = 0; j < KW; ++j) a = fmaf(wr[j][i], win[j].v[i], a);
      acc.v[i] = a;
    }
    emit(row, acc);
#pragma unroll
    for (int j = 0; j + 1 < KW; ++j) win[j] = win[j + 1];
  };
  // Output rows [r, end) of the sequence starting at row s0. Row q of its xpad = concat(state,
  // x) is the state's row q for q < P (only an owner asks for those: st, or NaN for a bad slot),
  // else x's row s0 + q - P.
  const auto run_rows = [&](int64_t s0, int64_t r, int64_t end, const TS* st, bool bad_slot) {
    const auto xpad = [&](int64_t q) -> Vec<V> {
      if (q < P) return bad_slot ? nans<V>() : load<V>(st + q * C);
      return load<V>(x + (s0 + q - P) * C + c);
    };
    if constexpr (KW > 0) {
      Vec<V> win[KW];
#pragma unroll
      for (int j = 0; j < KW - 1; ++j) win[j] = xpad(r - s0 + j);
      int64_t row = r;
      for (; row + kUnroll <= end; row += kUnroll) {
        Vec<V> xn[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) xn[u] = load<V>(x + (row + u) * C + c);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) step(win, row + u, xn[u]);
      }
      for (; row < end; ++row) step(win, row, load<V>(x + row * C + c));
    } else {
      for (int64_t row = r; row < end; ++row) {
        Vec<V> acc;
#pragma unroll
        for (int i = 0; i < V; ++i) acc.v[i] = 0.0f;
        for (int j = 0; j < W; ++j) {
          const Vec<V> xv = xpad(row - s0 + j);
#pragma unroll
          for (int i = 0; i < V; ++i) acc.v[i] = fmaf(w[(c + i) * W + j], xv.v[i], acc.v[i]);
        }
        emit(row, acc);
      }
    }
  };

  if (blockIdx.x < B) {
    // Owner of sequence b: its rows t < P (the only ones that read the old state), then the new
    // state, rows T .. T+P-1 of xpad, every old row read before any is stored. Its bounds and
    // slot are loaded together, so the state loads wait on one round of index loads.
    const int64_t b = blockIdx.x;
    const int64_t s0 = cu[b], s1 = cu[b + 1];
    const int64_t slot = slots[b];
    if (P == 0 || s1 <= s0) return;  // no state, or no rows: the state stays as it is
    const bool bad_slot = slot < 0 || slot >= num_slots;
    TS* st = bad_slot ? nullptr : pool + slot * P * C + c;
    const int64_t T = s1 - s0;
    if constexpr (KW > 0) {
      // All in registers: the old state, the sequence's first rows and, for T > P, its last P
      // rows of x (the new state) are loaded at once; for T <= P the window after the last row
      // holds the new state (xpad rows T .. T+P-1), old rows included.
      Vec<V> win[KW], tail[KW - 1];
#pragma unroll
      for (int j = 0; j < KW - 1; ++j) win[j] = bad_slot ? nans<V>() : load<V>(st + j * C);
      const bool long_seq = T > KW - 1;
      if (long_seq) {
#pragma unroll
        for (int i = 0; i < KW - 1; ++i) tail[i] = load<V>(x + (s1 - (KW - 1) + i) * C + c);
      }
      for (int64_t row = s0; row < min(s1, s0 + (KW - 1)); ++row)
        step(win, row, load<V>(x + row * C + c));
      if (bad_slot) return;
      if (long_seq) {
#pragma unroll
        for (int i = 0; i < KW - 1; ++i) store<V>(st + i * C, tail[i]);
      } else {
#pragma unroll
        for (int i = 0; i < KW - 1; ++i) store<V>(st + i * C, win[i]);
      }
    } else {
      run_rows(s0, s0, min(s1, s0 + P), st, bad_slot);
      if (bad_slot) return;
      // Ascending i: row i takes xpad row T + i > i, not stored yet.
      for (int i = 0; i < P; ++i) {
        const int64_t q = T + i;
        store<V>(st + i * C, q < P ? load<V>(st + q * C) : load<V>(x + (s0 + q - P) * C + c));
      }
    }
    return;
  }

  // Row chunk [r0, r1): every row t >= P of its sequences (x only).
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) - B) * L;
  if (r0 >= N) return;
  const int64_t r1 = min(N, r0 + L);
  // The sequence of row r0: the b < B with cu[b] <= r0 < cu[b + 1]. First the guess of equal
  // lengths (two independent loads; exact for equal prompts), else a binary search for the last
  // b with cu[b] <= r0 (cu[B] = N > r0 ends it).
  int64_t b = min(B - 1, r0 * B / N);
  int64_t s0 = cu[b], s1 = cu[b + 1];
  if (!(s0 <= r0 && r0 < s1)) {
    int64_t lo = 0, hi = B - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) >> 1;
      if (cu[mid] <= r0) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    b = lo;
    s0 = cu[b];
    s1 = cu[b + 1];
  }
  int64_t r = r0;
  while (r < r1) {
    while (r >= s1 && b + 1 < B) {
      ++b;
      s0 = s1;
      s1 = cu[b + 1];
    }
    if (r >= s1 || r < s0) return;  // cu_seqlens not as the contract says: leave the rest
    if (r - s0 < P) {               // the owner's rows
      r = min(s1, s0 + P);
      continue;
    }
    const int64_t end = min(s1, r1);
    run_rows(s0, r, end, nullptr, false);
    r = end;
  }
}

template <int KW, int V, class TX, class TO, class TS>
void launch_conv(cudaStream_t stream, dim3 grid, const TX* x, const float* w, TS* pool,
                 const int32_t* slots, const int64_t* cu, TO* out, int64_t N, int64_t C, int64_t W,
                 int64_t B, int64_t num_slots, int64_t L, bool silu) {
  conv_varlen_kernel<KW, V><<<grid, kThreads, 0, stream>>>(
      x, w, pool, slots, cu, out, N, C, static_cast<int>(W), B, num_slots, L, silu);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int V, class TX, class TO, class TS>
void launch_conv_w(cudaStream_t stream, dim3 grid, const TX* x, const float* w, TS* pool,
                   const int32_t* slots, const int64_t* cu, TO* out, int64_t N, int64_t C,
                   int64_t W, int64_t B, int64_t num_slots, int64_t L, bool silu) {
  switch (W) {
    case 2:
      return launch_conv<2, V>(stream, grid, x, w, pool, slots, cu, out, N, C, W, B, num_slots, L,
                               silu);
    case 3:
      return launch_conv<3, V>(stream, grid, x, w, pool, slots, cu, out, N, C, W, B, num_slots, L,
                               silu);
    case 4:
      return launch_conv<4, V>(stream, grid, x, w, pool, slots, cu, out, N, C, W, B, num_slots, L,
                               silu);
    default:
      return launch_conv<0, V>(stream, grid, x, w, pool, slots, cu, out, N, C, W, B, num_slots, L,
                               silu);
  }
}

// Calls f(T{}) with T = bf16 or float (a tag: the lambda takes the element type from it).
template <class T>
struct Elem {
  using type = T;
};
template <class F>
void with_elem(bool is_bf16, F&& f) {
  if (is_bf16) {
    f(Elem<bf16>{});
  } else {
    f(Elem<float>{});
  }
}

}  // namespace

namespace launch {

void causal_conv1d_varlen(cudaStream_t stream, const void* x, const float* w, void* pool,
                          const int32_t* slots, const int64_t* cu, void* out, int64_t N, int64_t C,
                          int64_t W, int64_t B, int64_t num_slots, bool silu, ConvDtypes dt,
                          bool vec4, int64_t rows_per_block) {
  if (N == 0 || C == 0 || B == 0) return;
  const int V = vec4 ? 4 : 1;
  const int64_t cblocks = (C + kThreads * V - 1) / (kThreads * V);
  int64_t L = rows_per_block;
  if (L <= 0) {
    // The longest chunk, at most 64 rows, for which owners and chunks together still give a
    // thread to each of the 2048 thread slots of 132 SMs. Each chunk reloads W-1 rows of x for
    // its window: 5% more reads at 64 rows, 19% at 16. On the H200 (one sequence of 8192 rows x
    // 12288 channels, 805 MB moved): 233 us at 16 rows, 225 at 32, 221 at 64, 219 at 128.
    constexpr int64_t kTargetThreads = int64_t{132} * 2048;
    L = 64;
    while (L > 1 && (B + (N + L - 1) / L) * cblocks * kThreads < kTargetThreads) L /= 2;
  }
  const int64_t blocks = B + (N + L - 1) / L;  // B owners, then the row chunks
  LOOM_CHECK_GRID(blocks);
  if (cblocks > 65535) {
    std::fprintf(stderr, "causal_conv1d_varlen: %lld channels exceed the CUDA grid limit\n",
                 static_cast<long long>(C));
    std::abort();
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(cblocks));
  with_elem(dt.x_bf16, [&](auto tx) {
    with_elem(dt.out_bf16, [&](auto to) {
      with_elem(dt.pool_bf16, [&](auto ts) {
        using TX = typename decltype(tx)::type;
        using TO = typename decltype(to)::type;
        using TS = typename decltype(ts)::type;
        const auto* xp = static_cast<const TX*>(x);
        auto* op = static_cast<TO*>(out);
        auto* pp = static_cast<TS*>(pool);
        if (vec4) {
          launch_conv_w<4>(stream, grid, xp, w, pp, slots, cu, op, N, C, W, B, num_slots, L, silu);
        } else {
          launch_conv_w<1>(stream, grid, xp, w, pp, slots, cu, op, N, C, W, B, num_slots, L, silu);
        }
      });
    });
  });
}

}  // namespace launch
}  // namespace loom::cuda
