// kda_decode_step (kernels/kda.h): a KDA / Gated DeltaNet layer's decode step from its projections
// to the normalised, gated output, one launch where three ran one after another
// (kda_decode_prepare, kda_decode_batched, rmsnorm_gated or rmsnorm + mul_silu): in a batch-1
// step those are latency-bound kernels of ~3.5 us each with HBM idle, so two fewer per layer is
// worth more than the parallelism the fused form gives up.
//
// Why one block can do it all. At decode, everything between the projections and the output
// projection depends only on one (row, key head): the convolution of the head's q, k and v
// channels, the norms, the gates, the recurrence over each of its value heads' states and the
// per-head output norm. So a block per (row b, key head) runs the three steps with a block barrier
// between them instead of a kernel boundary, and nothing goes through global memory but the
// inputs, the states and the output.
//
// Order of work in a block (512 threads):
//  1. The first value head's state tile (dk x dv f32) is requested into shared memory by
//     cp.async, so that its latency (the largest read) overlaps the preparation.
//  2. The preparation, a warp a task (kernels/cuda/kda_decode_prep.cuh's pieces): the q head, the
//     k head (convolution, l2 norm), the value heads' v channels (convolution), their decay gates
//     (exp taken as the recurrence takes it) and betas, into shared memory, each value rounded to
//     the type the separate kernel stores it in.
//  3. For each value head: the recurrence of kda_decode_smem_kernel (kernels/cuda/kda_decode.cu)
//     with the layout `layout` it would take for this batch (LPR column lanes, WARPS warps a
//     column tile): G tile groups of WARPS warps take the head's column tiles in turn, each
//     summing its rows in that kernel's order and reducing over its warps as reduce_over_rows
//     does; the output row is rounded to the activation type into shared memory and the state
//     written back from the staged tile. Then warp 0 normalises the row as rmsnorm_gated_kernel
//     (kernels/cuda/kda_gated_norm.cu) does, times sigmoid(gate) or silu(gate), into out.
//
// Bits: every value is what the separate kernels compute (the same operations in the same order on
// the same stored values); tests/gpu/kda_fused_cuda_test.cc compares them bit for bit.
//
// Slots: as the two kernels it replaces. A negative slot is a padding row: no state is touched,
// its output row is the norm of a zero row. A slot past the conv pool reads that state as NaN and
// writes none (kda_decode_prepare); past the recurrent pool the row's recurrence output is NaN and
// no recurrent state is touched (kda_decode_batched).
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/cuda/kda_decode_prep.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/smem_opt_in.cuh"

namespace loom::cuda {
namespace {

using launch::KdaDecodeStepArgs;
using namespace kda_prep;

constexpr int kThreads = 512;
constexpr int kWarpsAll = kThreads / 32;
constexpr int kMaxOutNormWarps = 8;  // norm.cu's 256-thread block

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}

// Shared memory of a block, carved from one dynamic array (every piece 16-byte aligned).
struct Smem {
  float* tile;  // [dk, dv]: a value head's state
  float* red;   // [G][WARPS][NR][LPR]: the tile groups' cross-warp sums
  float* es;    // [R, gw]: exp(g) of each value head (gw = dk, or 1 for one decay a head)
  float* bt;    // [R]: beta as the recurrence reads it
  float* o;     // [dv]: a value head's recurrence output, as stored in the activation type
  void* q;      // [dk] of TX: the normalised q head
  void* k;      // [dk] of TX
  void* v;      // [R, dv] of TX
};

__host__ __device__ inline size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Sizes in bytes, in Smem's order. red_floats: G * WARPS * NR * LPR for the layout.
struct SmemPlan {
  size_t tile, red, es, bt, o, q, k, v;
  __host__ __device__ size_t total() const { return tile + red + es + bt + o + q + k + v; }
};
__host__ __device__ inline SmemPlan smem_plan(int dk, int dv, int R, int gw, int red_floats,
                                              int elem) {
  SmemPlan p;
  p.tile = align16(sizeof(float) * static_cast<size_t>(dk) * dv);
  p.red = align16(sizeof(float) * static_cast<size_t>(red_floats));
  p.es = align16(sizeof(float) * static_cast<size_t>(R) * gw);
  p.bt = align16(sizeof(float) * static_cast<size_t>(R));
  p.o = align16(sizeof(float) * static_cast<size_t>(dv));
  p.q = align16(static_cast<size_t>(elem) * dk);
  p.k = p.q;
  p.v = align16(static_cast<size_t>(elem) * R * dv);
  return p;
}

// Tile groups and the reduction scratch of the two layouts (kda_decode.cu's layouts 1 and 3).
template <int LPR, int WARPS>
struct Layout {
  static constexpr int VW = 4, C = LPR * VW, RPW = 32 / LPR, RP = WARPS * RPW, NR = 2 * VW + 1;
  static constexpr int G = kWarpsAll / WARPS;  // tile groups a block
  static constexpr int kRedFloats = G * WARPS * NR * LPR;
};
using Layout1 = Layout<4, 4>;
using Layout3 = Layout<16, 8>;

// reduce_over_rows (kda_decode.cu) for one tile group: the shuffles over the lanes of a column,
// then the sum over the group's warps through red (this group's [WARPS][NR][LPR]), in order from
// 0.0f. Block-wide barriers: every thread of the block calls it the same number of times.
template <int NR, int LPR, int WARPS>
__device__ __forceinline__ void reduce_group(float (&acc)[NR], float* red, int wg, int rl, int cl) {
#pragma unroll
  for (int o = LPR; o < 32; o <<= 1) {
#pragma unroll
    for (int x = 0; x < NR; ++x) acc[x] += __shfl_xor_sync(0xffffffffu, acc[x], o);
  }
  if (rl == 0) {
#pragma unroll
    for (int x = 0; x < NR; ++x) red[(wg * NR + x) * LPR + cl] = acc[x];
  }
  __syncthreads();
#pragma unroll
  for (int x = 0; x < NR; ++x) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) t += red[(w * NR + x) * LPR + cl];
    acc[x] = t;
  }
  __syncthreads();  // red is free for the next tile
}

// rmsnorm_gated_kernel's row (kda_gated_norm.cu) on a row staged in shared memory (x: the values
// as the separate kernel would load them), one warp: out = as_stored<O>(w * (x * mul)) * act(gate).
template <typename O, int V>
__device__ __forceinline__ void gated_norm_row(const float* x, const float* __restrict__ w,
                                               const O* gate, bool silu, O* out, int64_t d,
                                               float eps, float p0, int nw, int lane) {
  const int64_t units = d / V, stride = 32 * nw;
  float part[kMaxOutNormWarps] = {};
#pragma unroll
  for (int wi = 0; wi < kMaxOutNormWarps; ++wi) {
    if (wi < nw) {
      float ss = 0.0f;
      for (int64_t u = 32 * wi + lane; u < units; u += stride) {
        float v[V];
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = x[u * V + j];
#pragma unroll
        for (int j = 0; j < V; ++j) ss += v[j] * v[j];  // as norm.cu's row_sum_squares
      }
      part[wi] = ss;
    }
  }
  const float ss = dev::norm_order_sum(part, nw, lane);
  const float mul = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t u = lane; u < units; u += 32) {
    float v[V], ww[V];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = x[u * V + j];
    dev::ld_vec<V>(w + u * V, ww);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float normed = dev::as_stored<O>((p0 + ww[j]) * (v[j] * mul));
      const float g = dev::ld(gate + u * V + j);
      v[j] = normed * (silu ? dev::silu(g) : dev::sigmoid(g));
    }
    dev::st_vec<V>(out + u * V, v);
  }
}

// Two blocks a multiprocessor (64 registers a thread): at batch 64 and more a block's serial
// phases (preparation, norm) then overlap the other block's state reads.
template <int KW, typename TX, class L>
__global__ void __launch_bounds__(kThreads, 2)
    kda_decode_step_kernel(const KdaDecodeStepArgs s, float p0) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  constexpr int VW = L::VW, C = L::C, RPW = L::RPW, RP = L::RP, NR = L::NR, G = L::G;
  constexpr int LPR = C / VW, WARPS = RP / RPW;
  const KdaDecodePrepArgs& a = s.prep;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b = blockIdx.x / a.Hk;
  const int hk = static_cast<int>(blockIdx.x - b * a.Hk);
  const int R = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  const int h0 = hk * R;
  const int gw = static_cast<int>(a.gate_width / a.Hv);
  const int64_t ck = static_cast<int64_t>(a.Hk) * dk, cv = static_cast<int64_t>(a.Hv) * dv;
  const int64_t C_all = 2 * ck + cv;

  extern __shared__ float4 smem4[];
  const SmemPlan plan = smem_plan(dk, dv, R, gw, L::kRedFloats, sizeof(TX));
  char* base = reinterpret_cast<char*>(smem4);
  Smem sm;
  sm.tile = reinterpret_cast<float*>(base);
  sm.red = reinterpret_cast<float*>(base += plan.tile);
  sm.es = reinterpret_cast<float*>(base += plan.red);
  sm.bt = reinterpret_cast<float*>(base += plan.es);
  sm.o = reinterpret_cast<float*>(base += plan.bt);
  sm.q = base += plan.o;
  sm.k = base += plan.q;
  sm.v = base += plan.k;

  const int64_t slot = a.slots[b];
  const bool pad = slot < 0;
  const bool rec_ok = !pad && slot < s.state_slots;
  // The recurrence's lanes: tile group g, warp wg in it, lane (rl, cl).
  const int g = warp / WARPS, wg = warp % WARPS;
  const int cl = lane % LPR, rl = lane / LPR;
  const int row0 = wg * RPW + rl;
  const int tiles = (dv + C - 1) / C;
  const auto state_of = [&](int h) {
    return s.state_pool + (slot * a.Hv + h) * static_cast<int64_t>(dk) * dv;
  };
  // The staging of value head h's state: each thread copies the 16-byte pieces it later reads.
  const auto stage = [&](int h) {
    if (!rec_ok) return;
    const float* S_g = state_of(h);
    for (int t0 = 0; t0 < tiles; t0 += G) {
      const int col = (t0 + g) * C + cl * VW;
      if (t0 + g >= tiles || col >= dv) continue;
      for (int r = row0; r < dk; r += RP)
        cp_async16(sm.tile + r * dv + col, S_g + static_cast<int64_t>(r) * dv + col);
    }
  };
  stage(h0);

  // The preparation: a warp a task.
  {
    const TX* xrow = static_cast<const TX*>(a.qkv) + b * C_all;
    TX* st = pad || slot >= a.num_slots
                 ? nullptr
                 : static_cast<TX*>(a.conv_pool) + slot * static_cast<int64_t>(a.W - 1) * C_all;
    const int v_chunks = (dv + kChunk - 1) / kChunk, g_chunks = (gw + kChunk - 1) / kChunk;
    const int tasks = 2 + R * v_chunks + R * g_chunks + 1;
    for (int t = warp; t < tasks; t += kWarpsAll) {
      if (t < 2) {
        const bool is_k = t == 1;
        TX* out = static_cast<TX*>(is_k ? sm.k : sm.q);
        const launch::NormOrder o = is_k ? a.k_order : a.q_order;
        const int64_t c0 = (is_k ? ck : 0) + static_cast<int64_t>(hk) * dk;
        constexpr int kV = dev::kVecWidth<TX>;
        if (o.vec == kV) {
          head_task<KW, TX, TX, kV>(a, xrow, st, pad, c0, C_all, out, o.threads / 32, lane);
        } else {
          head_task<KW, TX, TX, 1>(a, xrow, st, pad, c0, C_all, out, o.threads / 32, lane);
        }
        continue;
      }
      int u = t - 2;
      if (u < R * v_chunks) {
        const int j = u / v_chunks, c = u % v_chunks;
        constexpr int kPerLane = kChunk / 32;
        int64_t ch[kPerLane];
        bool ok[kPerLane];
        float y[kPerLane];
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int e = c * kChunk + i * 32 + lane;
          ch[i] = 2 * ck + static_cast<int64_t>(h0 + j) * dv + e;
          ok[i] = !pad && e < dv;
        }
        conv_channels<KW>(xrow, a.conv_w, st, ch, ok, C_all, a.W, y);
        TX* vrow = static_cast<TX*>(sm.v) + j * dv;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
          const int e = c * kChunk + i * 32 + lane;
          if (e < dv) dev::st(vrow + e, y[i]);  // pad: SiLU(0) = 0
        }
        continue;
      }
      u -= R * v_chunks;
      if (u < R * g_chunks) {
        const int j = u / g_chunks, c = u % g_chunks;
#pragma unroll
        for (int i = 0; i < kChunk / 32; ++i) {
          const int e = c * kChunk + i * 32 + lane;
          if (e >= gw) break;
          // kda_decode_prepare stores g in f32; the recurrence takes expf of it.
          sm.es[j * gw + e] = expf(gate_value(a, b, static_cast<int64_t>(h0 + j) * gw + e));
        }
        continue;
      }
      for (int j = lane; j < R; j += 32) {
        const float y = beta_value(a, b * a.Hv + h0 + j);
        sm.bt[j] = a.beta_bf16 ? dev::as_stored<dev::bf16>(y) : y;
      }
    }
  }

  const TX* qx = static_cast<const TX*>(sm.q);
  const TX* kx = static_cast<const TX*>(sm.k);
  const float kNaN = __int_as_float(0x7fc00000);
  for (int j = 0; j < R; ++j) {
    const int h = h0 + j;
    if (j > 0) {
      __syncthreads();  // every thread is done with the previous head's tile and row
      stage(h);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();  // the preparation's values, the staged tile
    const float* es = sm.es + j * gw;
    const float bt = sm.bt[j];
    const TX* vrow = static_cast<const TX*>(sm.v) + j * dv;
    for (int t0 = 0; t0 < tiles; t0 += G) {
      const int col = (t0 + g) * C + cl * VW;
      const bool col_ok = t0 + g < tiles && col < dv;
      float acc[NR];
#pragma unroll
      for (int x = 0; x < NR; ++x) acc[x] = 0.0f;
      if (col_ok && rec_ok) {
        // kda_decode_smem_kernel's sums: rows row0, row0 + RP, ... of this lane's columns.
#pragma unroll 4
        for (int r = row0; r < dk; r += RP) {
          const float4 tv = *reinterpret_cast<const float4*>(sm.tile + r * dv + col);
          const float e = es[gw == 1 ? 0 : r], kr = dev::ld(kx + r), qr = dev::ld(qx + r) * s.scale;
          const float x[VW] = {tv.x * e, tv.y * e, tv.z * e, tv.w * e};
#pragma unroll
          for (int c = 0; c < VW; ++c) {
            acc[c] = fmaf(kr, x[c], acc[c]);
            acc[VW + c] = fmaf(qr, x[c], acc[VW + c]);
          }
          acc[2 * VW] = fmaf(qr, kr, acc[2 * VW]);
        }
      }
      reduce_group<NR, LPR, WARPS>(acc, sm.red + g * WARPS * NR * LPR, wg, rl, cl);
      if (!col_ok) continue;
      if (!rec_ok) {
        if (wg == 0 && rl == 0) {
#pragma unroll
          for (int c = 0; c < VW; ++c) sm.o[col + c] = pad ? 0.0f : kNaN;
        }
        continue;
      }
      float u[VW];
      float vv[VW];
#pragma unroll
      for (int c = 0; c < VW; ++c) vv[c] = dev::ld(vrow + col + c);
#pragma unroll
      for (int c = 0; c < VW; ++c) u[c] = bt * (vv[c] - acc[c]);
      if (wg == 0 && rl == 0) {
#pragma unroll
        for (int c = 0; c < VW; ++c)
          sm.o[col + c] = dev::as_stored<TX>(fmaf(u[c], acc[2 * VW], acc[VW + c]));
      }
      float* S_g = state_of(h) + col;
#pragma unroll 4
      for (int r = row0; r < dk; r += RP) {
        const float4 tv = *reinterpret_cast<const float4*>(sm.tile + r * dv + col);
        const float e = es[gw == 1 ? 0 : r], kr = dev::ld(kx + r);
        __stcs(reinterpret_cast<float4*>(S_g + static_cast<int64_t>(r) * dv),
               make_float4(fmaf(kr, u[0], tv.x * e), fmaf(kr, u[1], tv.y * e),
                           fmaf(kr, u[2], tv.z * e), fmaf(kr, u[3], tv.w * e)));
      }
    }
    __syncthreads();  // the output row
    if (warp == 0) {
      const int64_t row = (b * a.Hv + h) * dv;
      const TX* gate = static_cast<const TX*>(s.gate) + row;
      TX* out = static_cast<TX*>(s.out) + row;
      constexpr int kV = dev::kVecWidth<TX>;
      const int nw = s.norm_order.threads / 32;
      if (s.norm_order.vec == kV) {
        gated_norm_row<TX, kV>(sm.o, s.norm_w, gate, s.gate_silu, out, dv, s.norm_eps, p0, nw,
                               lane);
      } else {
        gated_norm_row<TX, 1>(sm.o, s.norm_w, gate, s.gate_silu, out, dv, s.norm_eps, p0, nw, lane);
      }
    }
  }
}

template <int KW, typename TX, class L>
void launch_step(cudaStream_t stream, const KdaDecodeStepArgs& a, size_t smem) {
  static std::atomic<uint64_t> smem_done{0};
  allow_smem(kda_decode_step_kernel<KW, TX, L>, launch::kda_decode_step_smem_limit(), smem_done);
  LOOM_MARK_PDL_KERNEL((kda_decode_step_kernel<KW, TX, L>));
  const int64_t blocks = a.prep.B * a.prep.Hk;
  kda_decode_step_kernel<KW, TX, L>
      <<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(a, 0.0f);
}

template <typename TX, class L>
void launch_width(cudaStream_t stream, const KdaDecodeStepArgs& a, size_t smem) {
  // KDA and GDN use width 4; any other runs the any-width loop (the same operations).
  if (a.prep.W == 4) return launch_step<4, TX, L>(stream, a, smem);
  return launch_step<0, TX, L>(stream, a, smem);
}

}  // namespace

namespace launch {

size_t kda_decode_step_smem(const KdaDecodeStepArgs& a) {
  const KdaDecodePrepArgs& p = a.prep;
  const int red = a.layout == 3 ? Layout3::kRedFloats : Layout1::kRedFloats;
  const int gw = p.Hv > 0 ? static_cast<int>(p.gate_width / p.Hv) : 0;
  return smem_plan(p.dk, p.dv, p.Hk > 0 ? p.Hv / p.Hk : 0, gw, red, p.act_bf16 ? 2 : 4).total();
}

size_t kda_decode_step_smem_limit() {
  static const size_t n = [] {
    int dev = 0, bytes = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<size_t>(bytes);
  }();
  return n;
}

int64_t kda_decode_step_wave_blocks() {
  static const int64_t n = [] {
    int dev = 0, count = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return int64_t{2} * count;  // __launch_bounds__(kThreads, 2)
  }();
  return n;
}

void kda_decode_step(cudaStream_t stream, const KdaDecodeStepArgs& a) {
  const KdaDecodePrepArgs& p = a.prep;
  if (p.B == 0) return;
  const size_t smem = kda_decode_step_smem(a);
  if (p.dk > kMaxDk || p.q_order.threads > 32 * kMaxNormWarps ||
      p.k_order.threads > 32 * kMaxNormWarps || a.norm_order.threads > 32 * kMaxOutNormWarps ||
      p.W < 1 || p.Hk < 1 || p.Hv % p.Hk != 0 || p.dv % 4 != 0 || p.act_bf16 != p.pool_bf16 ||
      (a.layout != 1 && a.layout != 3) || smem > kda_decode_step_smem_limit()) {
    std::fprintf(stderr,
                 "kda_decode_step (CUDA): unsupported dk %d dv %d Hk %d Hv %d W %d layout %d or "
                 "%zu bytes of shared memory\n",
                 p.dk, p.dv, p.Hk, p.Hv, p.W, a.layout, smem);
    std::abort();
  }
  LOOM_CHECK_GRID(p.B * p.Hk);
  dev::with_elem(p.act_bf16, [&](auto xt) {
    using TX = typename decltype(xt)::type;
    if (a.layout == 3) return launch_width<TX, Layout3>(stream, a, smem);
    return launch_width<TX, Layout1>(stream, a, smem);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
