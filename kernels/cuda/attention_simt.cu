// Varlen softmax attention over a paged cache on CUDA cores (f32 arithmetic): the kernel of every
// GQA call and of MLA calls the tensor-core kernel (attention_mla_tc.cu) does not take (f32
// pools, other dims).
//
// Work. A persistent grid walks the schedule's items (attn_schedule, attention.cu); an item is up
// to rows_per_item new rows of one sequence and a range of keys (all of them, or one split), and
// each item runs once per (KV group, head tile). A block (8 warps) holds QV = 8 * QPW query
// vectors, each a (row, head) pair of the item: rows_per_item rows times heads_per_item heads.
// Warp w owns query vectors [w QPW, (w + 1) QPW).
//
// Per tile of 32 keys (cp.async into shared memory, two stages when they fit, else one): lane j
// scores key j against the warp's query vectors (q broadcast from shared memory, keys 16 bytes at
// a time: row strides make the 32 lanes' rows fall in distinct banks), the online softmax runs
// in registers (warp max and sum by xor shuffles), and the value sum takes each key's weight from
// its lane by shuffle while lanes own value columns c = lane + 32 i (CPT of them).
//
// Row invariance. A row's output is a function of its q, its visible keys and the split of its
// sequence alone: key tiles start at the split's first key (absolute positions), keys past a
// row's length get weight exactly 0 (so a tile holding other rows' keys leaves its sums
// unchanged), and every sum runs in a fixed order. Which item, tile or warp holds the row does not
// matter.
//
// FP8 pools (AttnArgs::kv_fp8) load through registers instead of cp.async: each vector's codes
// times its scale, stored into f32 tiles, so the arithmetic after the load is the f32 pools' and
// a value is exactly the host's dequantized one.
//
// The kernel template is in attention_simt.cuh, instantiated per pool dtype in
// attention_simt_f32.cu, attention_simt_bf16.cu and attention_simt_fp8.cu; this file sizes and
// launches it.
#include <array>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention_simt.cuh"

namespace loom::cuda {
namespace {

using simt::kKeys;
using simt::kWarps;
using simt::SimtParams;

int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Shared-memory layout of a call.
struct Layout {
  int dk_pad, off2, dks, dvs, stages;
  size_t bytes;
};

Layout layout_for(const launch::AttnArgs& a, int qpw, int stages) {
  const int es = a.kv_bf16 ? 2 : 4;
  Layout L;
  L.off2 = round_up(a.d1, 8);
  L.dk_pad = round_up(L.off2 + a.d2, 8);
  if (a.kv_bf16) {  // rows 16 bytes mod 128: eight lanes' 16-byte reads in distinct banks
    L.dks = (L.dk_pad + 55) / 64 * 64 + 8;
  } else {
    L.dks = (L.dk_pad + 27) / 32 * 32 + 4;
  }
  L.dvs = a.v != nullptr ? round_up(a.dv, 8) : 0;
  L.stages = stages;
  L.bytes = static_cast<size_t>(kWarps * qpw) * L.dk_pad * 4 +
            static_cast<size_t>(stages) * kKeys * (L.dks + L.dvs) * es;
  return L;
}

// The device's shared-memory opt-in limit per block (cached per device).
int max_smem_optin() {
  static std::array<std::atomic<int>, 64> cached{};
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cache = dev >= 0 && dev < 64;
  if (cache && cached[dev].load(std::memory_order_relaxed) > 0) return cached[dev].load();
  int v = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (cache) cached[dev].store(v);
  return v;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

namespace launch {

SimtShape attn_simt_shape(const AttnArgs& a, int qpw) {
  SimtShape s;
  s.qpw = a.v == nullptr ? 4 : qpw;
  const int qv = kWarps * s.qpw;
  const int rep = a.heads / a.groups;
  s.heads_per_item = rep < qv ? rep : qv;
  s.rows_per_item = qv / s.heads_per_item;
  return s;
}

bool attn_simt_fits(const AttnArgs& a, int qpw) {
  if (simt::cpt_for(a.dv) == 0 || (a.v == nullptr && a.dv > a.d1)) return false;
  const SimtShape s = attn_simt_shape(a, qpw);
  return layout_for(a, s.qpw, 1).bytes <= static_cast<size_t>(max_smem_optin());
}

void attn_simt(cudaStream_t stream, const AttnArgs& a, int qpw, int64_t max_items) {
  const SimtShape s = attn_simt_shape(a, qpw);
  const size_t limit = static_cast<size_t>(max_smem_optin());
  Layout L = layout_for(a, s.qpw, 2);
  if (L.bytes > limit) L = layout_for(a, s.qpw, 1);
  const int es = a.kv_bf16 ? 2 : 4;
  SimtParams P;
  P.a = a;
  P.dk_pad = L.dk_pad;
  P.off2 = L.off2;
  P.dks = L.dks;
  P.dvs = L.dvs;
  P.stages = L.stages;
  P.nh = s.heads_per_item;
  const int rep = a.heads / a.groups;
  P.htpg = (rep + P.nh - 1) / P.nh;
  P.units = a.groups * P.htpg;
  const auto aligned4 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  P.vec = a.kv_fp8 ? a.d1 % 4 == 0 && a.d2 % 4 == 0 && a.k1_row % 4 == 0 && aligned4(a.k1) &&
                         (a.d2 == 0 || (a.k2_row % 4 == 0 && aligned4(a.k2))) &&
                         (a.v == nullptr || (a.dv % 4 == 0 && a.v_row % 4 == 0 && aligned4(a.v)))
                   : (static_cast<int64_t>(a.d1) * es) % 16 == 0 &&
                         (static_cast<int64_t>(a.d2) * es) % 16 == 0 && (a.k1_row * es) % 16 == 0 &&
                         aligned16(a.k1) &&
                         (a.d2 == 0 || ((a.k2_row * es) % 16 == 0 && aligned16(a.k2))) &&
                         (a.v == nullptr || ((static_cast<int64_t>(a.dv) * es) % 16 == 0 &&
                                             (a.v_row * es) % 16 == 0 && aligned16(a.v)));
  if (a.kv_fp8) {
    simt::launch_fp8(stream, P, s.qpw, L.bytes, max_items);
  } else if (a.kv_bf16) {
    simt::launch_bf16(stream, P, s.qpw, L.bytes, max_items);
  } else {
    simt::launch_f32(stream, P, s.qpw, L.bytes, max_items);
  }
}

}  // namespace launch
}  // namespace loom::cuda
