// Raw launchers of the varlen attention kernels (kernels/cuda/attention*.cu). Like launch.h this
// header includes no Loom or Abseil header, so nvcc never parses Abseil; the Tensor-level entry
// points and their checks are in kernels/cuda/attention.{h,cc}. cu_seqlens, past_lens and the
// page table live on the device and are never copied back: the host sizes every launch from
// shapes alone (rows, sequences, page-table width), and the kernels read the step data.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define LOOM_ATTN_HD __host__ __device__
#else
#define LOOM_ATTN_HD
#endif

namespace loom::cuda::launch {

// How a call's query rows become work items (attn_schedule). An item is up to rows_per_item
// consecutive new rows of one sequence and one range of keys. A sequence of 1..split_rows new
// rows (decode, a few draft tokens) splits its keys into chunks of keys_per_split(L) keys (L: its
// last row's visible length), each chunk an item of its own, combined afterwards
// (flash-decoding); other sequences never split. split_rows = 0: nothing splits.
//
// Two ways to size the chunks:
//  - per length (wave_items = 0): min_chunk as given, so a row's split, and with it its bits,
//    depend on its own length alone (the GQA and CUDA-core paths; the tensor-core MLA paths when
//    a test or benchmark asks for it);
//  - by occupancy (wave_items > 0; MLA on tensor cores in the default mode): the schedule kernel
//    picks one min_chunk for the whole call from every sequence's length (choose_chunk in
//    attention.cu), so that the items fill the persistent kernel's wave_items concurrent items
//    a whole number of times without splitting more than that needs. min_chunk is then the
//    floor of that choice. A row's bits then depend on the other sequences' lengths: the
//    batch-invariant mode never splits, so it is unaffected.
struct AttnPolicy {
  int rows_per_item = 1;
  int split_rows = 0;
  int min_chunk = 512;  // keys per split at least; a multiple of key_block
  int max_splits = 64;
  int key_block = 32;  // chunks are multiples of the kernel's key tile
  // Occupancy-aware sizing (0: per length). The costs are in keys of cache traffic: a unit's
  // fixed cost (staging its queries), a split partial's (written, then read by the combine).
  int wave_items = 0;
  int unit_keys = 0;
  int part_keys = 0;
  int max_parts = 0;  // partial slots a call may use at most (the workspace's bound), 0: no cap
};

// Keys per split of a sequence whose last new row sees L keys (0: it does not split), given the
// policy's min_chunk (with wave_items > 0, the one the schedule chose for the call).
LOOM_ATTN_HD inline int64_t keys_per_split(const AttnPolicy& p, int64_t L) {
  int64_t n = (L + p.min_chunk - 1) / p.min_chunk;
  if (n > p.max_splits) n = p.max_splits;
  if (n <= 1) return 0;
  const int64_t per = (L + n - 1) / n;
  return (per + p.key_block - 1) / p.key_block * p.key_block;
}

// Upper bounds of one call's schedule from host-known sizes: N rows, B sequences, contexts of at
// most max_context keys (page-table width times page size).
struct AttnBounds {
  int64_t items = 0;       // work items
  int64_t split_rows = 0;  // rows whose keys split
  int64_t parts = 0;       // partial results of those rows (one per split)
};
AttnBounds attn_bounds(const AttnPolicy& p, int64_t N, int64_t B, int64_t max_context);

// A schedule in device memory (the caller's workspace), written by attn_schedule.
struct AttnSchedule {
  int32_t* counts = nullptr;          // [2]: items, split rows
  int32_t* items = nullptr;           // [bounds.items][4]: sequence, first row, rows, split
  int32_t* seq_chunk = nullptr;       // [B]: keys per split (0: the sequence does not split)
  int32_t* seq_off = nullptr;         // [B][3]: first item, part and split row of each sequence
  int32_t* row_nsplit = nullptr;      // [N]: splits of each row's keys (1: written directly)
  int32_t* row_part = nullptr;        // [N]: first partial slot of a split row
  int32_t* split_row_list = nullptr;  // [bounds.split_rows]: the split rows
};
// Bytes of the arrays of a schedule of `bounds` for N rows and B sequences (each array 256-byte
// aligned), and their places in a buffer of that size.
size_t attn_schedule_bytes(const AttnBounds& bounds, int64_t N, int64_t B);
AttnSchedule attn_schedule_carve(void* buffer, const AttnBounds& bounds, int64_t N, int64_t B);

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) resident on the
// whole current device at once: the grid of a persistent kernel. Raises the kernel's dynamic
// shared-memory limit to smem; cached per (device, kernel, smem), so only a first launch pays
// for the driver queries.
int64_t resident_blocks(const void* kernel, int threads, size_t smem);

// One block: the items, per-row splits and partial slots of a call.
void attn_schedule(cudaStream_t stream, const AttnPolicy& policy, const int64_t* cu,
                   const int64_t* past, int64_t N, int64_t B, const AttnSchedule& s);

// The attention pass over a paged cache. Query vector (row r, head h): q + r * q_row + h * q_head,
// d1 values then d2 values (f32, or bf16 with q_bf16). Key j of a sequence lives in pool row
// i = page_table[seq][j / page_size] * page_size + j % page_size: part 1 at
// k1 + i * k1_row + g * d1 (d1 values), part 2 at k2 + i * k2_row + g * d2, the value at
// v + i * v_row + g * dv, or, with v null, the first dv values of part 1 (the MLA latent); g the
// query head's group h / (heads / groups). Pools f32, or bf16 with kv_bf16, or fp8 with kv_fp8
// (kernels/attention.h's format: a vector of d values is d e4m3 codes and a 4-byte f32 scale, so
// row strides count bytes and vector g of a row starts at g * (d + 4); the kernels dequantize as
// they load, f32(code) * scale). Scores are scale * (q1 . k1 + q2 . k2), causal per row.
// A row that does not split gets its normalised output at o + r * o_row + h * o_head (f32, or
// bf16 with o_bf16); a split row's split s leaves its unnormalised sum at part_acc
// [row_part[r] + s][heads][dv] and its running max (log2 units) and sum at part_ml [..][heads][2].
struct AttnArgs {
  const void* q = nullptr;
  int64_t q_row = 0, q_head = 0;
  bool q_bf16 = false;
  const void* k1 = nullptr;
  int64_t k1_row = 0;
  const void* k2 = nullptr;
  int64_t k2_row = 0;
  const void* v = nullptr;
  int64_t v_row = 0;
  bool kv_bf16 = false;
  bool kv_fp8 = false;
  int d1 = 0, d2 = 0, dv = 0;
  int heads = 0, groups = 1;
  void* o = nullptr;
  int64_t o_row = 0, o_head = 0;
  bool o_bf16 = false;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  const int32_t* page_table = nullptr;
  int64_t max_pages = 0, page_size = 0, num_pages = 0;
  const int64_t* cu = nullptr;
  const int64_t* past = nullptr;
  AttnSchedule sched;
  float scale = 1.0f;
  // Benchmarks only (the results are wrong): 1 loads only the first key tiles of each unit (the
  // arithmetic's time), 2 skips the arithmetic (the loads' time); wgmma MLA kernel: 3 returns
  // after its setup (a launch's floor), 4 runs each unit without its key tiles (query staging and
  // output alone); mla_latent_attention_varlen: 5 runs the schedule alone, 6 no combine.
  int probe = 0;
  // The wgmma MLA kernel's P handoff between its two consumer warpgroups: false, the producer
  // side of each named barrier only arrives (bar.arrive); true, both sides wait (bar.sync).
  // Both are ordered by PTX; the second is what compute-sanitizer's racecheck can follow.
  bool sync_handoff = false;
};

// The CUDA-core kernel (attention_simt.cu): any dims (smem permitting), f32, bf16 or fp8 pools.
// qpw: query vectors per warp (1 or 4; the block has 8 warps). Returns false (launching nothing)
// when the shapes need more shared memory than a block has.
struct SimtShape {
  int qpw = 4;             // query vectors per warp
  int heads_per_item = 0;  // query heads of one group in an item
  int rows_per_item = 0;   // rows per item (the schedule's policy must match)
};
SimtShape attn_simt_shape(const AttnArgs& a, int qpw);
bool attn_simt_fits(const AttnArgs& a, int qpw);
void attn_simt(cudaStream_t stream, const AttnArgs& a, int qpw, int64_t max_items);

// The tensor-core MLA kernel (attention_mla_tc.cu): bf16 pools, d1 = 512 (latent), d2 = 64 or 0
// (rope), values the latent, groups = 1, q f32 (rounded to bf16 for the products), o f32.
// 32 heads per work unit (more heads: several units per row); one row per item. bn: keys per
// tile (32 or 64), stages: tile buffers (2 for 64 keys, 3 or 4 for 32). Or fp8 pools with a rope
// pool (dequantized to bf16 as they load; always 64 keys and 2 buffers, bn and stages ignored).
bool mla_tc_supported(const AttnArgs& a);
void mla_attn_tc(cudaStream_t stream, const AttnArgs& a, int64_t max_items, int bn, int stages);
// Blocks of the kernel that mla_attn_tc launches with these tiles (fp8: its fp8 one), resident
// at once.
int64_t mla_tc_resident(int bn, int stages, bool fp8 = false);

// The Hopper MLA kernel (attention_mla_wgmma.cu): what mla_tc_supported needs, a rope pool, fewer
// than 2^31 pool rows, and a compute capability 9.0 device; the same units and outputs as
// mla_attn_tc. fp8 pools (contiguous rows of 516 and 68 bytes, 16-byte aligned pools): its fp8
// variant, 64-key tiles, whose raw rows arrive by bulk copies and are widened to bf16 tiles in
// shared memory (TMA boxes need 16-byte row strides). bn: keys per tile, 64 (two stages) or 32
// (four; not fp8). Any page size; tiles that cross a page are copied without TMA (slower), so
// pages of a multiple of bn keys are its case.
bool mla_wgmma_supported(const AttnArgs& a);
void mla_attn_wgmma(cudaStream_t stream, const AttnArgs& a, int64_t max_items, int bn);
// Blocks of the kernel that mla_attn_wgmma launches with this tile (fp8: its fp8 one), resident
// at once.
int64_t mla_wgmma_resident(int bn, bool fp8 = false);

// Combines the partials of every split row into its output o (GQA, and MLA's latent core). With
// `spread` and few split rows, each (row, head) spreads over several blocks of columns, and a
// block's threads over groups of splits (summed per group in split order, then over the groups
// in order): the order then depends on how many rows split, so only calls whose splits depend
// on the batch already (occupancy-sized) spread; the others sum every split in order.
void attn_combine(cudaStream_t stream, const AttnArgs& a, int64_t max_split_rows, bool spread);

// MLA projections (attention.cu), f32, every output element a fixed-order sum (row-invariant):
//   q_lat[t, h, :R] = W_UK_h^T q[t, h, :dn], q_lat[t, h, R:] = q[t, h, dn:] (the rope part);
//   out[t, h, :] = W_UV_h o_lat[t, h, :], o_lat combined from the partials for split rows
//   (part_acc null: attn_combine has combined them into o_lat already).
// kv_b [H * (dn + dv), R]; q [N, H, dn + dr] and out [N, H, dv] f32 or bf16 (act_bf16).
void mla_absorb_q(cudaStream_t stream, const void* q, bool act_bf16, const float* kv_b,
                  float* q_lat, int64_t N, int64_t H, int64_t dn, int64_t dr, int64_t dv,
                  int64_t R);
void mla_project_out(cudaStream_t stream, const float* o_lat, const float* part_acc,
                     const float* part_ml, const AttnSchedule& sched, const float* kv_b, void* out,
                     bool act_bf16, int64_t N, int64_t H, int64_t dn, int64_t dv, int64_t R);

// MLA's expanded form (kernels/cuda/mla_key_gather.cu): keys [key0, key0 + nk) of one sequence,
// whose page-table row is `pages` (device, covering those positions), copied out of bf16 pools of
// num_pages pages into contiguous rows: lat [nk, R] and rope [nk, dr] bf16 (a page id outside
// the pool is not read: zeros). R and dr multiples of 8 (16-byte rows; dr may be 0). With fp8,
// the pools hold fp8 vectors (rows of R + 4 and dr + 4 bytes), dequantized into those bf16 rows.
void mla_gather_keys(cudaStream_t stream, const void* latent_pool, const void* rope_pool, int64_t R,
                     int64_t dr, bool fp8, const int32_t* pages, int64_t page_size,
                     int64_t num_pages, int64_t key0, int64_t nk, void* lat, void* rope);
// out[i] = cu[i] - cu[0] for i < n (a sub-batch's cu_seqlens, rows counted from its first).
void shift_offsets(cudaStream_t stream, const int64_t* cu, int64_t n, int64_t* out);

}  // namespace loom::cuda::launch
