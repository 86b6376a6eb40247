// MLA attention in absorbed form over a bf16 paged cache on Hopper's own path: TMA copies into an
// mbarrier pipeline fed by a producer warp, wgmma with the keys read from shared memory (fp8
// pools: a variant that widens their rows into the same tiles, below). The decode kernel of
// mla_attention_varlen for bf16 and fp8 pools with R = 512 and dr = 64 (kernels/cuda/attention.cc
// picks it, or attention_mla_tc.cu's mma.sync kernel, by AttentionTuning::mla_path); the same
// work units, split schedule, outputs and combine as that kernel.
//
// Block: three warpgroups, one block per multiprocessor, persistent over the units (a unit: 32
// heads of one query row and one split of its keys, as in attention_mla_tc.cu). The third
// gives its registers to the other two (setmaxnreg) and one warp of it works:
//   warp 8, the producer: streams the key tiles of the block's units, across unit boundaries,
//     into ST stages of BN keys. A tile of BN keys inside one page and the row's visible keys
//     is 9 TMA boxes of [BN keys][64 dims] (8 latent, 1 rope) in the 128-byte-swizzled layout
//     wgmma reads, each completing its own mbarrier so the scores can start on the first box;
//     any other tile (crossing a page, past the row's last key, a bad page id) is copied by the
//     warp with cp.async, zero-filling the rows it must not read.
//   warpgroup 0: S = Q K^T (wgmma m64nBNk16, Q and K from shared memory; the 32 heads are rows
//     0..31 of the m64 tile, rows 32..63 read whatever follows and are never used), mask and
//     online softmax in registers (a row lives in a quad), P (bf16) straight from the score
//     registers into the A operand of O[:, 0:256] += P V (wgmma m64n256k16, V = the latent of
//     the same tile, N-major), and P and its rescale factor to shared memory for warpgroup 1;
//   warpgroup 1: O[:, 256:512] += P V with P from shared memory.
// Two named barriers order P between the warpgroups (written, consumed); one mbarrier per stage
// returns it to the producer when all eight consumer warps are done with it.
//
// Why this shape: a 64-key tile is 74 KB and ~2.3 us of one multiprocessor's share of the copy
// bandwidth, while its tensor work (m64 rows for 32 heads: half of it padding) is ~1.2 us at
// the datasheet rate, and the softmax is a few hundred cycles: warpgroup 0 is busy about half
// the time and the tile after the next is requested as soon as a stage frees. FlashMLA (sm90,
// dense decode) takes the same route with 64 heads and both warpgroups issuing the copies.
//
// Measured on the H200 (tests/gpu/attention_cuda_bench.cc, 2026-12-01, three runs, copy
// 4.14-4.20 TB/s; the mma.sync kernel in brackets): batch 64 at 4K / 32K / 128K keys 2.55 /
// 3.00-3.06 / 2.96-3.19 TB/s, 61 / 72-74 / 71-77% of the copy (1.84-1.88 / 2.12-2.26 /
// 2.22-2.26); batch 8: 0.62-0.69 / 2.51-2.70 / 2.74-2.80 (0.46 / 1.87-1.89 / 2.07-2.10);
// batch 1: 0.08-0.09 / 0.60-0.66 / 1.83-1.92 (0.06 / 0.44-0.45 / 1.46-1.47). Its probes at
// batch 64, 32K: the arithmetic alone 79-85% of the copy, the loads alone 81-82%, both with
// the split partials (64 KB a unit of 1024 keys, written here and read back by the combine:
// ~11% more traffic at batch 64). Short of 80% for two reasons: two stages (a third does not
// fit beside Q) return ~1.3 us after they land, so about 1.5 tiles are in flight a
// multiprocessor; and the partials. With 2048 keys a split: 3.31-3.35 / 3.14-3.48 TB/s at
// batch 64, 32K / 128K (75-84%), but fewer splits starve batch 1 (0.40-0.45 at 32K). Tried and
// no faster: the next unit's Q prefetched by warpgroup 1 into a second buffer (2-4% slower:
// it delays P V); 32-key tiles in four stages (55-61% at batch 64).
//
// FP8 pools (mla_wgmma_kernel<64, 2, true>; kernels/attention.h's rows: 512 codes + an f32 scale
// = 516 bytes, 64 + 4 = 68 for the rope key; TMA boxes need 16-byte row strides): the consumers
// are unchanged and read the same bf16 tiles; warpgroup 2 makes them. Warp 8 fills a ring of four
// raw slots of 16 rows (9,344 bytes each, after the bars) with two 1D bulk copies a slot (a tile
// of whole rows of one page starts 16-byte aligned: rows 4 k of 516 / 68 bytes), or, for any
// other tile (a page edge, the row's last keys, a bad page), with 4-byte cp.async copies
// zero-filling the rows it must not read; warps 9-11 widen a slot's rows (every third),
// f32(code) * scale rounded to bf16 exactly as attention_mla_tc.cu's fp8 path does, into the
// stage's swizzled tile, then fence.proxy.async and arrive on the stage's barriers. So the outputs
// over fp8 pages are, bit for bit, the bf16 kernel's over pages of the dequantized values (same
// splits; kv_fp8_cuda_test). Measured on the H200 (2026-12-04, copy 4.18 TB/s, GB/s of fp8 bytes,
// 584 a key): batch 64 at 128K 984 (4.98 ms; bf16 pages 2.31 ms, the mma.sync fp8 route 5.93),
// batch 8 959, batch 1 708 (0.108 ms; bf16 0.071, mma.sync 0.132). Its probes at batch 64: the
// loads and widening alone 1385 GB/s (3.54 ms), the arithmetic alone 1.99 ms: warpgroup 2 bounds
// it (three widening warps, one tile of raw rows in flight), and the arithmetic alone is 86% of
// the bf16 kernel's whole time, so fp8 pages cannot gain much here before the products shrink.
//
// Numerics as attention_mla_tc.cu: q and P rounded to bf16 for the products, f32 sums, softmax
// in log2 units; a row's result depends only on its own q, keys and split (tiles start at the
// split's first key, masked keys weigh exactly 0 against finite or zero-filled rows).
#include <cuda.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"

namespace loom::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kHeads = 32;     // query heads per unit: rows 0..31 of the m64 tiles
constexpr int kThreads = 384;  // two consumer warpgroups, then the producer's
constexpr int kChunks = 9;     // 64-dim pieces of a cache row: 8 latent, 1 rope
constexpr int kQBytes = kChunks * kHeads * 128;
constexpr int kPBytes = 64 * 128;
// Shared memory from a 1024-byte-aligned base (the swizzle's period): Q [9][32 heads][128 B],
// P [64 rows][128 B] (Q's last piece spills its unused rows 32..63 into it), ST stages of
// [9][BN keys][128 B], the rescale factors, the row max and sum, the mbarriers.
//
// FP8 pools (F8): after the bars, a ring of kRawSlots raw slots of kRawKeys rows each, the
// pool's bytes as they are (latent rows of 516 bytes, then rope rows of 68).
constexpr int kF8Lat = 512 + 4, kF8Rope = 64 + 4;  // fp8 row bytes: codes and the f32 scale
template <int BN, int ST, bool F8 = false>
struct Cfg {
  static constexpr int kChunk = BN * 128;
  static constexpr int kStage = kChunks * kChunk;
  static constexpr int kOffP = kQBytes, kOffK = kOffP + kPBytes;
  static constexpr int kOffAlpha = kOffK + ST * kStage;
  static constexpr int kOffMl = kOffAlpha + 64 * 4;
  static constexpr int kOffBar = kOffMl + 2 * kHeads * 4;
  static constexpr int kRawSlots = F8 ? 4 : 0, kRawKeys = BN / 4;
  static constexpr int kRawLat = kRawKeys * kF8Lat, kRawSlot = kRawLat + kRawKeys * kF8Rope;
  static constexpr int kOffRaw = kOffBar + (ST * (kChunks + 1) + 2 * kRawSlots) * 8;
  static constexpr size_t kBytes =
      (F8 ? kOffRaw + kRawSlots * kRawSlot : kOffBar + ST * (kChunks + 1) * 8) + 1024;
  static_assert(BN == 32 || BN == 64, "key tiles of 32 or 64");
  static_assert(!F8 || (BN == 64 && ST == 2), "fp8: 64-key tiles in two stages");
  static_assert(kOffRaw % 16 == 0 && kRawLat % 16 == 0 && kRawSlot % 16 == 0, "bulk copies");
  static_assert(kBytes <= 227 * 1024, "shared memory");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_MLA_WGMMA 1

// Named barriers (0 is __syncthreads): P written (warpgroup 0 arrives, 1 waits), P consumed
// (the other way), and both consumer warpgroups at a unit's edges. fp8 with sync_handoff: the raw
// ring's producer and widening warps (warpgroup 2) meet once a slot use (kRawStep).
constexpr int kPReady = 1, kPFree = 2, kUnit = 3, kRawStep = 4;

struct Unit {
  int seq, split, h0, ntiles;
  int64_t row, L, kb, ke;
};

// Unit u of the schedule (as attention_mla_tc.cu numbers them: items times head tiles).
__device__ __forceinline__ Unit unit_at(const launch::AttnArgs& a, int64_t u, int htiles, int bn) {
  const int4 it = reinterpret_cast<const int4*>(a.sched.items)[u / htiles];
  Unit w;
  w.h0 = static_cast<int>(u % htiles) * kHeads;
  w.seq = it.x;
  w.split = it.w;
  w.row = it.y;
  const int64_t chunk = a.sched.seq_chunk[w.seq];
  w.L = a.past[w.seq] + (w.row - a.cu[w.seq]) + 1;
  w.kb = chunk > 0 ? w.split * chunk : 0;
  w.ke = chunk > 0 ? min(w.L, w.kb + chunk) : w.L;
  w.ntiles =
      __shfl_sync(0xffffffffu, w.ke > w.kb ? static_cast<int>((w.ke - w.kb + bn - 1) / bn) : 0, 0);
  return w;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Matrix descriptors, 128-byte swizzle, 8-row groups 1024 bytes apart. K-major: rows of 128
// bytes along the reduction (Q, K, P). N-major: the values, 64 dims contiguous in a key row and
// the next 64 dims `lbo` bytes further.
__device__ __forceinline__ uint64_t desc_k(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ uint64_t desc_n(uint32_t addr, uint32_t lbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int x, int y,
                                       uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}
// A 1D bulk copy (16-byte aligned, a multiple of 16 bytes) completing on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(ok ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from touching accumulators across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void keep(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// S (+)= Q K^T, m64nBNk16, both operands K-major in shared memory; acc = 0 starts from zero.
__device__ __forceinline__ void wgmma_qk(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
// O += P V, m64n256k16, V N-major in shared memory: P in registers (the A fragment of mma.sync's
// m16n8k16 per warp) or K-major in shared memory.
__device__ __forceinline__ void wgmma_pv_reg(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
      "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, "
      "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "
      "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, "
      "%129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_pv_smem(float (&d)[128], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
      "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, "
      "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "
      "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, "
      "%129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(acc));
}
#endif  // LOOM_MLA_WGMMA

#if defined(LOOM_MLA_WGMMA)
// fp8: a raw row of a tile in shared memory (its codes and scales, or zeros), as lane `lane`
// widens it: latent words lane + 32 k and, below 16, rope word lane.
struct F8Row {
  uint32_t w[4], x;
  float sl, sr;
};
__device__ __forceinline__ F8Row f8_load_row(const unsigned char* lr, const unsigned char* rr,
                                             int lane) {
  F8Row v;
#pragma unroll
  for (int k = 0; k < 4; ++k) v.w[k] = reinterpret_cast<const uint32_t*>(lr)[lane + 32 * k];
  v.x = lane < 16 ? reinterpret_cast<const uint32_t*>(rr)[lane] : 0u;
  v.sl = *reinterpret_cast<const float*>(lr + 512);
  v.sr = *reinterpret_cast<const float*>(rr + 64);
  return v;
}
// Row R of the stage's bf16 tile from it: f32(code) * scale rounded to bf16, as attention_mla_tc
// .cu's fp8 path does, in the swizzled layout the TMA boxes have (word w holds dims 4 w .. 4 w + 3:
// chunk w / 16, piece (w & 15) / 2, half w & 1).
template <int kChunk>
__device__ __forceinline__ void f8_store_row(unsigned char* stage, int R, const F8Row& v,
                                             int lane) {
  unsigned char* row = stage + R * 128;
  const int sw = R & 7;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int wi = lane + 32 * k;
    const float4 f = dev::kv_fp8_word(v.w[k], v.sl);
    *reinterpret_cast<uint2*>(row + (wi >> 4) * kChunk + ((((wi & 15) >> 1) ^ sw) << 4) +
                              (wi & 1) * 8) = make_uint2(pack_bf16(f.x, f.y), pack_bf16(f.z, f.w));
  }
  if (lane < 16) {
    const float4 f = dev::kv_fp8_word(v.x, v.sr);
    *reinterpret_cast<uint2*>(row + 8 * kChunk + (((lane >> 1) ^ sw) << 4) + (lane & 1) * 8) =
        make_uint2(pack_bf16(f.x, f.y), pack_bf16(f.z, f.w));
  }
}
#endif

template <int BN, int ST, bool F8 = false>
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_kernel(const launch::AttnArgs a, const __grid_constant__ CUtensorMap tm_lat,
                     const __grid_constant__ CUtensorMap tm_rope) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
#if defined(LOOM_MLA_WGMMA)
  using C = Cfg<BN, ST, F8>;
  constexpr int NT = BN / 8;   // n8 score columns per thread row
  constexpr int KS = BN / 16;  // k16 steps of P V
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* gbase = smem_raw + (base - raw);
  const uint32_t sQ = base, sP = base + C::kOffP, sK = base + C::kOffK;
  float* alpha_s = reinterpret_cast<float*>(gbase + C::kOffAlpha);
  float* ml_s = reinterpret_cast<float*>(gbase + C::kOffMl);  // [2][32]: max, sum
  const uint32_t bars = base + C::kOffBar;
  const auto full = [&](int s, int c) { return bars + (s * kChunks + c) * 8; };
  const auto empty = [&](int s) { return bars + (ST * kChunks + s) * 8; };
  // fp8: a raw slot filled (bulk copies or the issuing warp's cp.async), and widened.
  const auto raw_full = [&](int q) { return bars + (ST * (kChunks + 1) + q) * 8; };
  const auto raw_empty = [&](int q) { return bars + (ST * (kChunks + 1) + C::kRawSlots + q) * 8; };

  // Roles by warpgroup, broadcast so that the compiler sees them uniform (it serialises wgmma
  // in code it cannot prove convergent).
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), wg = warp >> 2;
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      for (int c = 0; c < kChunks; ++c) mbar_init(full(s, c), F8 ? 3 : 1);  // fp8: 3 widening warps
      mbar_init(empty(s), 8);  // the eight consumer warps
    }
    for (int q = 0; q < C::kRawSlots; ++q) {
      mbar_init(raw_full(q), 1);
      mbar_init(raw_empty(q), 3);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (a.probe == 3) return;  // benchmarks: a launch and its setup alone

  const int H = a.heads;
  const int htiles = (H + kHeads - 1) / kHeads;
  const int64_t total =
      static_cast<int64_t>(__shfl_sync(0xffffffffu, a.sched.counts[0], 0)) * htiles;

  if constexpr (F8) {
    if (wg == 2) {
      // ---- fp8 producers: warp 8 fills the raw ring, warps 9-11 widen it into the stages ----
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
      constexpr int RK = C::kRawKeys, RS = C::kRawSlots;
      static_assert(RK % 3 == 1 && RS == 4, "a slot's first row of warp cw; four slots a tile");
      const unsigned char* lat8 = static_cast<const unsigned char*>(a.k1);
      const unsigned char* rope8 = static_cast<const unsigned char*>(a.k2);
      const uint32_t ps = static_cast<uint32_t>(a.page_size);
      // A tile of whole rows of one page inside the row's keys, 16-byte aligned (rows 4 k): its
      // first pool row, four bulk copies of RK rows each; else -1 (rows one by one).
      const auto bulk_row = [&](const Unit& w, const int32_t* table, int t) -> int64_t {
        const int64_t pos0 = w.kb + static_cast<int64_t>(t) * BN;
        const uint32_t p32 = static_cast<uint32_t>(pos0), page = p32 / ps, off = p32 - page * ps;
        const int64_t pid = table[page];
        if (pid >= 0 && pid < a.num_pages && off + BN <= ps && pos0 + BN <= w.L) {
          const int64_t prow = pid * a.page_size + off;
          if ((prow & 3) == 0) return prow;
        }
        return -1;
      };
      int it = 0, q = 0;
      if (warp == 8) {
        uint64_t policy;  // the cache is read once
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
        for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
          const Unit w = unit_at(a, u, htiles, BN);
          const int32_t* table = a.page_table + w.seq * a.max_pages;
          for (int t = 0; t < (a.probe == 4 ? 0 : w.ntiles); ++t, ++it) {
            if (a.probe == 1 && t >= ST) continue;  // benchmarks: the arithmetic on stale tiles
            const int64_t prow = bulk_row(w, table, t);
            if (prow >= 0) {
#pragma unroll 1
              for (int j = 0; j < 4; ++j, ++q) {
                const int slot = q % RS;
                if (q >= RS) mbar_wait(raw_empty(slot), ((q / RS) - 1) & 1);
                if (lane == 0) {
                  const uint32_t dst = base + C::kOffRaw + slot * C::kRawSlot;
                  const int64_t r0 = prow + j * RK;
                  mbar_expect_tx(raw_full(slot), C::kRawSlot);
                  bulk_copy(dst, lat8 + r0 * kF8Lat, C::kRawLat, raw_full(slot), policy);
                  bulk_copy(dst + C::kRawLat, rope8 + r0 * kF8Rope, RK * kF8Rope, raw_full(slot),
                            policy);
                }
                if (a.sync_handoff) {  // racecheck: the copies landed, then meet the readers
                  mbar_wait(raw_full(slot), (q / RS) & 1);
                  bar_sync(kRawStep, 128);
                }
              }
              continue;
            }
            // Rows one by one (a page edge, the row's last keys, a bad page): 4-byte copies,
            // zeros where a row must not be read (its weight is 0; 0 times unwritten bytes could
            // be NaN), the four slots' copies in flight together, one commit group each. Lane
            // r < RK finds row r's pool row.
            const int64_t pos0 = w.kb + static_cast<int64_t>(t) * BN;
            // Slot use `use` gets the tile's rows RK j .. RK j + RK - 1, as one commit group.
            const auto issue_rows = [&](int use, int j) {
              const int slot = use % RS;
              if (use >= RS) mbar_wait(raw_empty(slot), ((use / RS) - 1) & 1);
              int64_t mine = -1;
              if (lane < RK) {
                const int64_t pos = pos0 + j * RK + lane;
                if (pos < w.ke) {
                  const uint32_t q32 = static_cast<uint32_t>(pos), pg = q32 / ps;
                  const int64_t id = table[pg];
                  if (id >= 0 && id < a.num_pages) mine = id * a.page_size + (q32 - pg * ps);
                }
              }
              const uint32_t dst = base + C::kOffRaw + slot * C::kRawSlot;
#pragma unroll 1
              for (int r = 0; r < RK; ++r) {
                const int64_t prow = __shfl_sync(0xffffffffu, mine, r);
                const bool ok = prow >= 0;
                const unsigned char* ls = lat8 + (ok ? prow : 0) * a.k1_row;
                const unsigned char* rs = rope8 + (ok ? prow : 0) * a.k2_row;
                for (int wd = lane; wd < kF8Lat / 4 + kF8Rope / 4; wd += 32) {
                  if (wd < kF8Lat / 4) {
                    cp_async4(dst + r * kF8Lat + 4 * wd, ls + 4 * wd, ok);
                  } else {
                    const int x = wd - kF8Lat / 4;
                    cp_async4(dst + C::kRawLat + r * kF8Rope + 4 * x, rs + 4 * x, ok);
                  }
                }
              }
              asm volatile("cp.async.commit_group;\n" ::: "memory");
            };
            if (a.sync_handoff) {
              // racecheck: a slot at a time, its copies complete before the readers are met (the
              // ring's mbarriers order the four slots in flight below, which racecheck can't see).
#pragma unroll 1
              for (int j = 0; j < 4; ++j, ++q) {
                issue_rows(q, j);
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                __syncwarp();
                if (lane == 0) mbar_arrive(raw_full(q % RS));
                bar_sync(kRawStep, 128);
              }
              continue;
            }
#pragma unroll 1
            for (int j = 0; j < 4; ++j) issue_rows(q + j, j);
              // Slot j is complete when at most 3 - j groups are pending.
#pragma unroll
            for (int j = 0; j < 4; ++j, ++q) {
              if (j == 0) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
              if (j == 1) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
              if (j == 2) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
              if (j == 3) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
              __syncwarp();
              if (lane == 0) mbar_arrive(raw_full(q % RS));
            }
          }
        }
        return;
      }
      const int cw = warp - 9;  // widening warps 0..2: tile rows R with R % 3 == cw
      for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
        const Unit w = unit_at(a, u, htiles, BN);
        for (int t = 0; t < (a.probe == 4 ? 0 : w.ntiles); ++t, ++it) {
          const int s = it % ST;
          if (it >= ST) mbar_wait(empty(s), ((it / ST) - 1) & 1);
          if (!(a.probe == 1 && t >= ST)) {
            unsigned char* stage = gbase + C::kOffK + s * C::kStage;
            fence_proxy_async();  // the stage was last read by wgmma
#pragma unroll 1
            for (int j = 0; j < 4; ++j, ++q) {
              const int slot = q % RS;
              if (a.sync_handoff) bar_sync(kRawStep, 128);
              mbar_wait(raw_full(slot), (q / RS) & 1);
              const unsigned char* raw = gbase + C::kOffRaw + slot * C::kRawSlot;
              // Tile row R = RK j + r; RK = 16 = 1 (mod 3). Two rows' loads before their
              // stores (one warp of this kind a scheduler: nothing else hides the latency).
              const auto lat_of = [&](int r) { return raw + r * kF8Lat; };
              const auto rope_of = [&](int r) { return raw + C::kRawLat + r * kF8Rope; };
#pragma unroll 1
              for (int r = (cw + 12 - j) % 3; r < RK; r += 6) {
                const bool two = r + 3 < RK;
                const F8Row v0 = f8_load_row(lat_of(r), rope_of(r), lane);
                F8Row v1{};
                if (two) v1 = f8_load_row(lat_of(r + 3), rope_of(r + 3), lane);
                f8_store_row<C::kChunk>(stage, RK * j + r, v0, lane);
                if (two) f8_store_row<C::kChunk>(stage, RK * j + r + 3, v1, lane);
              }
              __syncwarp();
              if (lane == 0) mbar_arrive(raw_empty(slot));
            }
            fence_proxy_async();  // our stores -> wgmma
          }
          __syncwarp();
          if (lane == 0)
            for (int c = 0; c < kChunks; ++c) mbar_arrive(full(s, c));
        }
      }
      return;
    }
  }
  if (wg == 2) {
    // ---- producer: one warp, on few registers ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp != 8) return;
    const bf16* latent = static_cast<const bf16*>(a.k1);
    const bf16* rope = static_cast<const bf16*>(a.k2);
    uint64_t policy;  // the cache is read once: leave L2 to q, the schedule and the partials
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_lat))
                   : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_rope))
                   : "memory");
    }
    const uint32_t ps = static_cast<uint32_t>(a.page_size);
    int it = 0;
    for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
      const Unit w = unit_at(a, u, htiles, BN);
      const int32_t* table = a.page_table + w.seq * a.max_pages;
      for (int t = 0; t < (a.probe == 4 ? 0 : w.ntiles); ++t, ++it) {
        const int s = it % ST;
        if (it >= ST) mbar_wait(empty(s), ((it / ST) - 1) & 1);
        const uint32_t stage = sK + s * C::kStage;
        if (a.probe == 1 && t >= ST) {  // benchmarks: the arithmetic on stale tiles
          if (lane == 0)
            for (int c = 0; c < kChunks; ++c) mbar_arrive(full(s, c));
          continue;
        }
        const int64_t pos0 = w.kb + static_cast<int64_t>(t) * BN;
        // 32-bit division, as in attention_mla_tc.cu (positions and page sizes fit).
        const uint32_t p32 = static_cast<uint32_t>(pos0), page = p32 / ps, off = p32 - page * ps;
        const int64_t pid = table[page];
        if (pid >= 0 && pid < a.num_pages && off + BN <= ps && pos0 + BN <= w.L) {
          if (lane == 0) {
            const int y = static_cast<int>(pid * a.page_size + off);
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
              mbar_expect_tx(full(s, c), C::kChunk);
              tma_2d(stage + c * C::kChunk, c < 8 ? &tm_lat : &tm_rope, c < 8 ? 64 * c : 0, y,
                     full(s, c), policy);
            }
          }
          continue;
        }
        // A tile TMA cannot take whole: rows past the split's keys or on a bad page are zeros
        // (their weight is 0, and 0 times an unwritten row could be NaN).
        fence_proxy_async();  // the stage was last read by wgmma
        for (int r = lane; r < BN; r += 32) {
          const int64_t pos = pos0 + r;
          int64_t prow = -1;
          if (pos < w.ke) {
            const uint32_t q32 = static_cast<uint32_t>(pos), pg = q32 / ps;
            const int64_t id = table[pg];
            if (id >= 0 && id < a.num_pages) prow = id * a.page_size + (q32 - pg * ps);
          }
          const bool ok = prow >= 0;
          const bf16* ls = latent + (ok ? prow : 0) * a.k1_row;
          const bf16* rs = rope + (ok ? prow : 0) * a.k2_row;
          const uint32_t dst = stage + r * 128, sw = r & 7;
#pragma unroll 8
          for (int piece = 0; piece < kChunks * 8; ++piece) {
            const int c = piece >> 3, kc = piece & 7;
            cp_async16(dst + c * C::kChunk + ((kc ^ sw) << 4), c < 8 ? ls + piece * 8 : rs + kc * 8,
                       ok);
          }
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        fence_proxy_async();  // our copies -> wgmma
        __syncwarp();
        if (lane == 0)
          for (int c = 0; c < kChunks; ++c) mbar_arrive(full(s, c));
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int wl = warp & 3;
  const int g = lane >> 2, c4 = lane & 3;
  const int r0 = 16 * wl + g, r1 = r0 + 8;  // this thread's rows of the m64 tiles
  // Rows 0..31 are heads; 32..63 are padding that every step computes alike (no warp of a
  // warpgroup takes another branch) and nothing reads.
  const float sl = a.scale * 1.4426950408889634f;
  const uint32_t vcol = wg * 4 * C::kChunk;  // this warpgroup's 256 value columns
  int it = 0;
  bool p_used = false;
  for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
    const Unit w = unit_at(a, u, htiles, BN);
    {  // Q to shared memory as bf16 (all loads first: one round trip)
      constexpr int kPer = kHeads * 288 / 256;  // float2 per thread
      const float* qr = static_cast<const float*>(a.q) + w.row * a.q_row;
      float2 v[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int i = tid + 256 * k, h = i / 288, d = (i - h * 288) * 2;
        v[k] = make_float2(0.0f, 0.0f);
        if (w.h0 + h < H)
          v[k] =
              *reinterpret_cast<const float2*>(qr + static_cast<int64_t>(w.h0 + h) * a.q_head + d);
      }
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int i = tid + 256 * k, h = i / 288, d = (i - h * 288) * 2;
        const int off =
            (d >> 6) * (kHeads * 128) + h * 128 + ((((d & 63) >> 3) ^ (h & 7)) << 4) + (d & 7) * 2;
        *reinterpret_cast<uint32_t*>(gbase + off) = pack_bf16(v[k].x, v[k].y);
      }
      fence_proxy_async();
      bar_sync(kUnit, 256);
    }

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // l: this thread's keys

    for (int t = 0; t < (a.probe == 4 ? 0 : w.ntiles); ++t, ++it) {
      const int s = it % ST;
      const uint32_t ph = (it / ST) & 1;
      const uint32_t stage = sK + s * C::kStage;
      if (a.probe == 2) {  // benchmarks: the loads alone
        for (int c = wg == 0 ? 0 : 4; c < (wg == 0 ? kChunks : 8); ++c) mbar_wait(full(s, c), ph);
        if (lane == 0) mbar_arrive(empty(s));
        continue;
      }
      if (wg == 0) {
        float sc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) sc[i] = 0.0f;
        wg_fence();
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          mbar_wait(full(s, c), ph);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            wgmma_qk(sc, desc_k(sQ + c * (kHeads * 128) + kk * 32),
                     desc_k(stage + c * C::kChunk + kk * 32), (c | kk) != 0);
        }
        wg_commit();
        wg_wait0();
        keep(sc);

        // Mask and online softmax; thread (g, c4) holds rows r0 (q < 2), r1 (q >= 2) at keys
        // 8 j + 2 c4 + (q & 1).
        float al0, al1;
        {
          const int64_t pb = w.kb + static_cast<int64_t>(t) * BN + 2 * c4;
          float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float x = pb + 8 * j + (q & 1) < w.ke ? sc[4 * j + q] * sl : -INFINITY;
              sc[4 * j + q] = x;
              if (q < 2) {
                mx0 = fmaxf(mx0, x);
              } else {
                mx1 = fmaxf(mx1, x);
              }
            }
          }
          mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
          mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
          mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
          mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
          const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
          const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
          al0 = exp2f(m0 - b0);
          al1 = exp2f(m1 - b1);
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float p = exp2f(sc[4 * j + q] - (q < 2 ? b0 : b1));
              sc[4 * j + q] = p;
              if (q < 2) {
                s0 += p;
              } else {
                s1 += p;
              }
            }
          }
          l0 = fmaf(l0, al0, s0);
          l1 = fmaf(l1, al1, s1);
          m0 = mn0;
          m1 = mn1;
        }
        uint32_t pa[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            pa[kk][e] = pack_bf16(sc[8 * kk + 2 * e], sc[8 * kk + 2 * e + 1]);
        }
        // P and the factors for warpgroup 1, once it is done with the previous tile's.
        if (p_used) bar_sync(kPFree, 256);
        p_used = true;
        {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint32_t* pr = pa[j >> 1] + 2 * (j & 1);
            *reinterpret_cast<uint32_t*>(gbase + C::kOffP + r0 * 128 + ((j ^ (r0 & 7)) << 4) +
                                         4 * c4) = pr[0];
            *reinterpret_cast<uint32_t*>(gbase + C::kOffP + r1 * 128 + ((j ^ (r1 & 7)) << 4) +
                                         4 * c4) = pr[1];
          }
          if (c4 == 0) {
            alpha_s[r0] = al0;
            alpha_s[r1] = al1;
          }
        }
        fence_proxy_async();
        if (a.sync_handoff) {
          bar_sync(kPReady, 256);
        } else {
          bar_arrive(kPReady, 256);
        }

#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j] *= al0;
          o[4 * j + 1] *= al0;
          o[4 * j + 2] *= al1;
          o[4 * j + 3] *= al1;
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; ++kk)
          wgmma_pv_reg(o, pa[kk], desc_n(stage + vcol + kk * 16 * 128, C::kChunk));
        wg_commit();
        wg_wait0();
        keep(o);
        if (lane == 0) mbar_arrive(empty(s));
      } else {
#pragma unroll
        for (int c = 4; c < 8; ++c) mbar_wait(full(s, c), ph);
        bar_sync(kPReady, 256);
        const float al0 = alpha_s[r0], al1 = alpha_s[r1];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j] *= al0;
          o[4 * j + 1] *= al0;
          o[4 * j + 2] *= al1;
          o[4 * j + 3] *= al1;
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; ++kk)
          wgmma_pv_smem(o, desc_k(sP + kk * 32), desc_n(stage + vcol + kk * 16 * 128, C::kChunk),
                        1);
        wg_commit();
        wg_wait0();
        keep(o);
        if (a.sync_handoff) {
          bar_sync(kPFree, 256);
        } else {
          bar_arrive(kPFree, 256);
        }
        if (lane == 0) mbar_arrive(empty(s));
      }
    }
    // Warpgroup 1's last kPFree of the unit is matched here, not at the next unit's first tile:
    // with sync_handoff its side waits too, and would otherwise block at the kUnit barrier below
    // that warpgroup 0 reaches first. It costs nothing: kUnit waits for that warpgroup anyway.
    if (wg == 0 && p_used) {
      bar_sync(kPFree, 256);
      p_used = false;
    }

    if (wg == 0) {  // the rows' sums over the quad, in a fixed order
      l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
      l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
      l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
      if (wl < 2 && c4 == 0) {
        ml_s[r0] = m0;
        ml_s[r1] = m1;
        ml_s[kHeads + r0] = l0;
        ml_s[kHeads + r1] = l1;
      }
    }
    bar_sync(kUnit, 256);
    if (wl < 2) {
      const int ns = a.sched.row_nsplit[w.row];
      const int64_t slot = ns > 1 ? static_cast<int64_t>(a.sched.row_part[w.row]) + w.split : 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = half ? r1 : r0, head = w.h0 + r;
        if (head >= H) continue;
        float* dst = ns <= 1 ? static_cast<float*>(a.o) + w.row * a.o_row +
                                   static_cast<int64_t>(head) * a.o_head
                             : a.part_acc + (slot * H + head) * 512;
        const float den = ml_s[kHeads + r];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          float v0 = o[4 * j + 2 * half], v1 = o[4 * j + 2 * half + 1];
          if (ns <= 1) {
            v0 /= den;
            v1 /= den;
          }
          *reinterpret_cast<float2*>(dst + wg * 256 + 8 * j + 2 * c4) = make_float2(v0, v1);
        }
        if (ns > 1 && wg == 0 && c4 == 0) {
          a.part_ml[(slot * H + head) * 2] = ml_s[r];
          a.part_ml[(slot * H + head) * 2 + 1] = den;
        }
      }
    }
  }
#else
  // Compiled for a device without wgmma: the host never launches this (mla_wgmma_supported).
  __trap();
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link to libcuda).
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    LOOM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                     cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr) {
      std::fprintf(stderr, "attention_mla_wgmma: the driver has no cuTensorMapEncodeTiled\n");
      std::abort();
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A pool of `rows` rows of `width` bf16 (`stride` apart) as TMA boxes of [box_rows][64], in the
// 128-byte swizzle the wgmma descriptors above name.
CUtensorMap pool_map(const void* pool, int64_t rows, int width, int64_t stride, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r =
      encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(pool), dims,
                     strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "attention_mla_wgmma: cuTensorMapEncodeTiled failed (%d)\n",
                 static_cast<int>(r));
    std::abort();
  }
  return m;
}

template <int BN, int ST, bool F8 = false>
void launch_wgmma(cudaStream_t stream, const launch::AttnArgs& a, int64_t max_items) {
  using C = Cfg<BN, ST, F8>;
  auto kernel = mla_wgmma_kernel<BN, ST, F8>;
  const int64_t htiles = (a.heads + kHeads - 1) / kHeads;
  int64_t blocks = max_items * htiles;
  const int64_t cap =
      launch::resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, C::kBytes);
  if (blocks > cap) blocks = cap;
  if (blocks < 1) return;
  const int64_t rows = a.num_pages * a.page_size;
  CUtensorMap lat{}, rope{};  // fp8 pools: no tensor maps (the kernel's own copies)
  if constexpr (!F8) {
    lat = pool_map(a.k1, rows, 512, a.k1_row, BN);
    rope = pool_map(a.k2, rows, 64, a.k2_row, BN);
  }
  LOOM_MARK_PDL_KERNEL((mla_wgmma_kernel<BN, ST, F8>));
  kernel<<<static_cast<unsigned>(blocks), kThreads, C::kBytes, stream>>>(a, lat, rope);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Compute capability 9.0, where the sm_90a code runs; per device, asked once.
bool device_is_sm90() {
  static std::atomic<int> known[64];  // 0: not asked, 1: yes, 2: no
  int dev = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  std::atomic<int>& k = known[dev & 63];
  int v = k.load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    v = major == 9 && minor == 0 ? 1 : 2;
    k.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

namespace launch {

bool mla_wgmma_supported(const AttnArgs& a) {
  // fp8: contiguous rows of 516 and 68 bytes from 16-byte aligned pools (the bulk copies).
  const bool f8_ok = !a.kv_fp8 || (a.k1_row == kF8Lat && a.k2_row == kF8Rope &&
                                   reinterpret_cast<uintptr_t>(a.k1) % 16 == 0 &&
                                   reinterpret_cast<uintptr_t>(a.k2) % 16 == 0);
  return f8_ok && mla_tc_supported(a) && a.k2 != nullptr &&
         a.num_pages * a.page_size < (int64_t{1} << 31) && device_is_sm90();
}

void mla_attn_wgmma(cudaStream_t stream, const AttnArgs& a, int64_t max_items, int bn) {
  if (a.kv_fp8) return launch_wgmma<64, 2, true>(stream, a, max_items);  // its one tile shape
  if (bn == 32) return launch_wgmma<32, 4>(stream, a, max_items);
  return launch_wgmma<64, 2>(stream, a, max_items);
}

int64_t mla_wgmma_resident(int bn, bool fp8) {
  if (fp8)
    return resident_blocks(reinterpret_cast<const void*>(mla_wgmma_kernel<64, 2, true>), kThreads,
                           Cfg<64, 2, true>::kBytes);
  if (bn == 32)
    return resident_blocks(reinterpret_cast<const void*>(mla_wgmma_kernel<32, 4>), kThreads,
                           Cfg<32, 4>::kBytes);
  return resident_blocks(reinterpret_cast<const void*>(mla_wgmma_kernel<64, 2>), kThreads,
                         Cfg<64, 2>::kBytes);
}

}  // namespace launch
}  // namespace loom::cuda
