// kda_decode_prepare (kernels/kda.h): everything a KDA layer's decode step runs between its
// projections and the recurrence, one launch instead of six (the short convolution with SiLU and
// its state update, the split into q, k, v, the two l2 norms, the decay gate and sigmoid(beta)),
// which cost ~13 us of launch-bound kernels per layer at batch 1. Gated DeltaNet's decode step
// runs it too (one decay gate per head: gate_width Hv).
//
// Work. Each warp takes one task of one row (row b is sequence b): a q or k head (the
// convolution of its dk channels, then their l2 norm), 128 channels of v (the convolution), 128
// decay gates, or 128 betas. Rows and tasks are flattened, kWarps tasks a block.
//
// Bits: every value is what the separate kernels store.
//  - Convolution: conv_varlen_kernel's operations for a one-token sequence (kernels/cuda/
//    conv_varlen.cu): acc = fmaf(w[c, j], xpad[j], acc) from 0 over the W-1 state rows then x,
//    SiLU, rounded to the activation type (the separate conv_out). The new state is the old rows
//    1 .. W-2 and x, stored as that kernel stores them.
//  - l2 norm of a head: kernels/cuda/norm.cu's reduction replayed (norm_order.cuh): a lane keeps
//    the values of the units that norm.cu's thread `lane` (or, for its 64-thread block, threads
//    lane and lane + 32) would read, summed in that thread's order, then the same shuffle trees;
//    out = x * (scale / sqrtf(ss + eps)).
//  - Gate: kda_gate_kernel's formula (kernels/cuda/kda.cu); beta: elementwise.cu's sigmoid.
//
// Slots: a negative slot is a padding row (a captured graph's filler, as in kda_decode.cu): its
// state is not touched and its q, k and v rows are zero (the norm of a zero head is zero); its
// gates and betas are computed as for any row. A slot >= num_slots (a caller bug) reads its
// state as NaN and writes none, as conv_varlen_kernel does for any bad slot.
#include "kernels/cuda/kda_decode_prep.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

using launch::KdaDecodePrepArgs;
using namespace kda_prep;  // conv_channels, head_task, gate_value, beta_value (shared pieces)

constexpr int kWarps = 4;  // tasks a block

template <int KW, typename TX, typename TS>
__global__ void __launch_bounds__(kWarps * 32)
    kda_decode_prep_kernel(const KdaDecodePrepArgs a, int64_t tasks_per_row, int v_tasks,
                           int g_tasks) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int lane = threadIdx.x & 31;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (task >= a.B * tasks_per_row) return;  // uniform across the warp
  const int64_t b = task / tasks_per_row;
  int64_t t = task % tasks_per_row;
  const int64_t ck = static_cast<int64_t>(a.Hk) * a.dk, cv = static_cast<int64_t>(a.Hv) * a.dv;
  const int64_t C = 2 * ck + cv;

  if (t < 2 * a.Hk + v_tasks) {
    // A convolution task: the row's slot, then a head or a run of v channels.
    const TX* xrow = static_cast<const TX*>(a.qkv) + b * C;
    const int64_t slot = a.slots[b];
    const bool pad = slot < 0;
    TS* st = pad || slot >= a.num_slots
                 ? nullptr
                 : static_cast<TS*>(a.conv_pool) + slot * static_cast<int64_t>(a.W - 1) * C;
    if (t < 2 * a.Hk) {
      const bool is_k = t >= a.Hk;
      const int64_t h = is_k ? t - a.Hk : t;
      TX* out = static_cast<TX*>(is_k ? a.k : a.q) + b * ck + h * a.dk;
      const launch::NormOrder o = is_k ? a.k_order : a.q_order;
      const int64_t c0 = (is_k ? ck : 0) + h * a.dk;
      constexpr int kV = dev::kVecWidth<TX>;
      if (o.vec == kV) {
        head_task<KW, TX, TS, kV>(a, xrow, st, pad, c0, C, out, o.threads / 32, lane);
      } else {
        head_task<KW, TX, TS, 1>(a, xrow, st, pad, c0, C, out, o.threads / 32, lane);
      }
      return;
    }
    t -= 2 * a.Hk;
    constexpr int kPerLane = kChunk / 32;
    int64_t ch[kPerLane];
    bool ok[kPerLane];
    float y[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = t * kChunk + i * 32 + lane;
      ch[i] = 2 * ck + e;
      ok[i] = !pad && e < cv;
    }
    conv_channels<KW>(xrow, a.conv_w, st, ch, ok, C, a.W, y);
    TX* vrow = static_cast<TX*>(a.v) + b * cv;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = t * kChunk + i * 32 + lane;
      if (e < cv) dev::st(vrow + e, y[i]);  // pad: SiLU(0) = 0
    }
    return;
  }
  t -= 2 * a.Hk + v_tasks;

  if (t < g_tasks) {
    // kda_gate_kernel's formula, element e of the row's gates.
#pragma unroll
    for (int i = 0; i < kChunk / 32; ++i) {
      const int64_t e = t * kChunk + i * 32 + lane;
      if (e >= a.gate_width) break;
      a.g[b * a.gate_width + e] = gate_value(a, b, e);
    }
    return;
  }
  t -= g_tasks;

  // sigmoid(beta) in place.
#pragma unroll
  for (int i = 0; i < kChunk / 32; ++i) {
    const int64_t e = t * kChunk + i * 32 + lane;
    if (e >= a.Hv) break;
    const int64_t idx = b * a.Hv + e;
    const float y = beta_value(a, idx);
    if (a.beta_bf16) {
      dev::st(static_cast<dev::bf16*>(a.beta) + idx, y);
    } else {
      dev::st(static_cast<float*>(a.beta) + idx, y);
    }
  }
}

template <int KW, typename TX, typename TS>
void launch_prep(cudaStream_t stream, unsigned blocks, const KdaDecodePrepArgs& a,
                 int64_t tasks_per_row, int v_tasks, int g_tasks) {
  LOOM_MARK_PDL_KERNEL((kda_decode_prep_kernel<KW, TX, TS>));
  kda_decode_prep_kernel<KW, TX, TS>
      <<<blocks, kWarps * 32, 0, stream>>>(a, tasks_per_row, v_tasks, g_tasks);
}

int64_t tasks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

}  // namespace

namespace launch {

void kda_decode_prepare(cudaStream_t stream, const KdaDecodePrepArgs& a) {
  if (a.B == 0) return;
  if (a.dk > kMaxDk || a.q_order.threads > 32 * kMaxNormWarps ||
      a.k_order.threads > 32 * kMaxNormWarps || a.W < 1 || a.Hv < 1 || a.Hk < 1) {
    std::fprintf(stderr, "kda_decode_prepare (CUDA): dk %d > %d or an unsupported norm order\n",
                 a.dk, kMaxDk);
    std::abort();
  }
  const int64_t cv = static_cast<int64_t>(a.Hv) * a.dv;
  const int v_tasks = static_cast<int>(tasks_of(cv));
  const int g_tasks = static_cast<int>(tasks_of(a.gate_width));
  const int64_t tasks_per_row = 2 * a.Hk + v_tasks + g_tasks + tasks_of(a.Hv);
  const int64_t blocks = (a.B * tasks_per_row + kWarps - 1) / kWarps;
  LOOM_CHECK_GRID(blocks);
  dev::with_elem(a.act_bf16, [&](auto xt) {
    dev::with_elem(a.pool_bf16, [&](auto st) {
      using TX = typename decltype(xt)::type;
      using TS = typename decltype(st)::type;
      const unsigned grid = static_cast<unsigned>(blocks);
      // The widths conv_varlen.cu compiles (KDA and GDN use 4); any other runs the generic loop.
      switch (a.W) {
        case 2:
          return launch_prep<2, TX, TS>(stream, grid, a, tasks_per_row, v_tasks, g_tasks);
        case 3:
          return launch_prep<3, TX, TS>(stream, grid, a, tasks_per_row, v_tasks, g_tasks);
        case 4:
          return launch_prep<4, TX, TS>(stream, grid, a, tasks_per_row, v_tasks, g_tasks);
        default:
          return launch_prep<0, TX, TS>(stream, grid, a, tasks_per_row, v_tasks, g_tasks);
      }
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
