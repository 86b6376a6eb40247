// Host side of the varlen CUDA attention ops: the checks of kernels/cpu/attention.cc that need no
// values from the device (shapes, dtypes, devices), the temporaries, then the launches:
//   GQA: schedule, attention (attention_simt.cu), combine of split rows;
//   MLA: schedule, q into latent space, attention over the latent cache (attention_mla_wgmma.cu,
//        attention_mla_tc.cu or attention_simt.cu), combine + out of latent space (attention.cu).
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_expanded_launch.h"

namespace loom::cuda {
namespace {

// Sequences of at most this many new rows split their keys (decode, a few draft tokens).
constexpr int kSplitRows = 8;
// Rows (query tokens) above which MLA's two projections run as cuBLAS GEMMs (mla()).
constexpr int64_t kMlaGemmMinRows = 64;
// Per-length split sizes. MLA: a split's partial (H x R f32, 64 KB at 32 heads) is ~5% of the
// 1.2 MB of bf16 cache that 1024 keys hold, and a 128K context still makes 128 splits. GQA: a
// partial is Hq x dv floats, small against 256 keys of K and V.
constexpr int kMlaMinChunk = 1024, kMlaMaxSplits = 128;
constexpr int kGqaMinChunk = 256, kGqaMaxSplits = 64;
// Occupancy-aware MLA splits (tensor-core paths, default mode): partial slots a call may use, in
// waves of the persistent kernel's concurrent items. The schedule's cost model never wants
// more than a few waves of split items (each costs a partial), and the cap bounds the
// workspace by the machine instead of by batch x 128 splits (512 MB at batch 64).
constexpr int kMlaPartWaves = 16;

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

bool is_act(DType t) { return t == DType::kF32 || t == DType::kBF16; }
// The pools the kernels read: f32, bf16, or fp8 (kernels/attention.h's vectors with scales).
bool is_pool(DType t) { return is_act(t) || t == DType::kF8E4M3; }

// LOOM_MLA_SYNC_HANDOFF=1 puts every call's wgmma MLA kernel on the bar.sync handoff
// (AttnArgs::sync_handoff): tests/gpu/sanitize.sh sets it under compute-sanitizer's racecheck,
// which follows neither the default bar.arrive side nor the fp8 raw ring's mbarriers and reports
// hazards there (bench/results).
bool sync_handoff_from_env() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_MLA_SYNC_HANDOFF");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

// LOOM_MLA_PROJECTION_KERNELS=1 keeps Loom's projection kernels at every row count (mla()): the
// GEMMs' A/B switch for benchmarks.
bool projection_kernels_from_env() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_MLA_PROJECTION_KERNELS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

// cu_seqlens, past_lens and page_table: dtypes and shapes (their values stay on the device).
// Returns B.
int64_t check_step(const char* fn, const Tensor& page_table, const Tensor& cu_seqlens,
                   const Tensor& past_lens) {
  LOOM_CHECK_CUDA_ARG(fn, page_table);
  LOOM_CHECK_CUDA_ARG(fn, cu_seqlens);
  LOOM_CHECK_CUDA_ARG(fn, past_lens);
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s: cu_seqlens %s, expected contiguous i64 [B + 1]", fn,
             cu_seqlens.describe().c_str());
  const int64_t B = cu_seqlens.dim(0) - 1;
  LOOM_CHECK(page_table.dtype() == DType::kI32 && page_table.ndim() == 2 &&
                 page_table.dim(0) == B && page_table.is_contiguous(),
             "%s: page_table %s for %lld sequences, expected contiguous i32 [B, pages]", fn,
             page_table.describe().c_str(), static_cast<long long>(B));
  LOOM_CHECK(past_lens.dtype() == DType::kI64 && past_lens.ndim() == 1 && past_lens.dim(0) == B &&
                 past_lens.is_contiguous(),
             "%s: past_lens %s for %lld sequences, expected contiguous i64 [B]", fn,
             past_lens.describe().c_str(), static_cast<long long>(B));
  return B;
}

// One device buffer for a call's temporaries: ex.workspace (released when this dies) or a
// stream-ordered allocation (freed in stream order after the launches).
class CallBuffer {
 public:
  CallBuffer(const Exec& ex, size_t bytes) {
    if (ex.workspace != nullptr) {
      mark_.emplace(*ex.workspace);
      t_ = ex.workspace->take({static_cast<int64_t>(bytes > 0 ? bytes : 1)}, DType::kU8);
      ptr_ = t_.raw();
    } else {
      scratch_.emplace(bytes, stream_of(ex));
      ptr_ = scratch_->get();
    }
  }
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  std::optional<Workspace::Mark> mark_;
  std::optional<Scratch> scratch_;
  Tensor t_;
  void* ptr_ = nullptr;
};

launch::AttnPolicy policy_for(const Exec& ex, const AttentionTuning& t, int rows_per_item,
                              int key_block, int min_chunk, int max_splits) {
  launch::AttnPolicy p;
  p.rows_per_item = rows_per_item;
  p.split_rows = ex.batch_invariant ? 0 : kSplitRows;
  p.key_block = key_block;
  p.min_chunk = t.min_chunk > 0 ? t.min_chunk : min_chunk;
  p.min_chunk = (p.min_chunk + key_block - 1) / key_block * key_block;
  p.max_splits = t.max_splits > 0 ? t.max_splits : max_splits;
  if (p.max_splits > 256) p.max_splits = 256;  // the combines weigh one split per thread
  if (p.max_splits <= 1) p.split_rows = 0;
  return p;
}

void check_bounds(const char* fn, const launch::AttnBounds& b, int64_t N, int64_t max_context) {
  LOOM_CHECK(b.items < INT_MAX && b.parts < INT_MAX && N < INT_MAX && max_context < INT_MAX,
             "%s: %lld rows, %lld work items, %lld partials or a %lld-position page table exceed "
             "32-bit indices",
             fn, static_cast<long long>(N), static_cast<long long>(b.items),
             static_cast<long long>(b.parts), static_cast<long long>(max_context));
}

// ---- GQA ------------------------------------------------------------------------------------

void gqa(const Exec& ex, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
         const Tensor& page_table, const Tensor& cu_seqlens, const Tensor& past_lens, float scale,
         const Tensor& out, const AttentionTuning& tuning) {
  const char* fn = "gqa_attention_varlen";
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, k_pool);
  LOOM_CHECK_CUDA_ARG(fn, v_pool);
  LOOM_CHECK_CUDA_ARG(fn, out);
  const int64_t B = check_step(fn, page_table, cu_seqlens, past_lens);
  LOOM_CHECK(
      is_act(q.dtype()) && out.dtype() == q.dtype() && q.is_contiguous() && out.is_contiguous(),
      "%s: q %s out %s, expected contiguous f32 or bf16, the same for both", fn,
      q.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(is_pool(k_pool.dtype()) && v_pool.dtype() == k_pool.dtype() &&
                 k_pool.is_contiguous() && v_pool.is_contiguous(),
             "%s: k_pool %s v_pool %s, expected contiguous f32, bf16 or fp8 pools of one dtype", fn,
             k_pool.describe().c_str(), v_pool.describe().c_str());
  LOOM_CHECK(q.ndim() == 3 && k_pool.ndim() == 4 && v_pool.ndim() == 4,
             "%s: q %s k_pool %s v_pool %s", fn, q.describe().c_str(), k_pool.describe().c_str(),
             v_pool.describe().c_str());
  const int64_t N = q.dim(0), hq = q.dim(1), d = q.dim(2);
  // fp8 pools: each kv head's vector carries its 4-byte scale (kv_pool_vector_dim).
  const int64_t num_pages = k_pool.dim(0), ps = k_pool.dim(1), hkv = k_pool.dim(2),
                dv = kv_pool_vector_dim(v_pool);
  LOOM_CHECK(hkv > 0 && hq % hkv == 0 && d > 0 && dv > 0 && ps > 0 &&
                 kv_pool_vector_dim(k_pool) == d && v_pool.dim(0) == num_pages &&
                 v_pool.dim(1) == ps && v_pool.dim(2) == hkv,
             "%s: q %s k_pool %s v_pool %s (need Hq %% Hkv == 0 and matching pools)", fn,
             q.describe().c_str(), k_pool.describe().c_str(), v_pool.describe().c_str());
  LOOM_CHECK_SHAPE(out, N, hq, dv);
  LOOM_CHECK(hq <= 65535 && d <= 65535 && dv <= 65535, "%s: q %s v_pool %s too large", fn,
             q.describe().c_str(), v_pool.describe().c_str());
  if (N == 0 || B == 0) return;

  launch::AttnArgs a;
  a.q = q.raw();
  a.q_row = hq * d;
  a.q_head = d;
  a.q_bf16 = q.dtype() == DType::kBF16;
  a.k1 = k_pool.raw();
  a.k1_row = hkv * k_pool.dim(3);
  a.k2 = nullptr;
  a.v = v_pool.raw();
  a.v_row = hkv * v_pool.dim(3);
  a.kv_bf16 = k_pool.dtype() == DType::kBF16;
  a.kv_fp8 = k_pool.dtype() == DType::kF8E4M3;
  a.d1 = static_cast<int>(d);
  a.d2 = 0;
  a.dv = static_cast<int>(dv);
  a.heads = static_cast<int>(hq);
  a.groups = static_cast<int>(hkv);
  a.o = out.raw();
  a.o_row = hq * dv;
  a.o_head = dv;
  a.o_bf16 = a.q_bf16;
  a.page_table = page_table.data<int32_t>();
  a.max_pages = page_table.dim(1);
  a.page_size = ps;
  a.num_pages = num_pages;
  a.cu = cu_seqlens.data<int64_t>();
  a.past = past_lens.data<int64_t>();
  a.scale = scale;
  a.probe = tuning.probe;
  a.sync_handoff = tuning.sync_handoff || sync_handoff_from_env();

  // Decode-like calls (about one row per sequence): a warp per query vector, so a row's heads
  // spread over the warps; otherwise four a warp, so a key tile serves more rows.
  const int qpw = tuning.gqa_qpw > 0 ? tuning.gqa_qpw : (N <= 2 * B ? 1 : 4);
  LOOM_CHECK(launch::attn_simt_fits(a, qpw),
             "%s: head dims d = %lld, dv = %lld need more shared memory than a block has "
             "(dv <= 512)",
             fn, static_cast<long long>(d), static_cast<long long>(dv));
  const launch::SimtShape shape = launch::attn_simt_shape(a, qpw);
  const launch::AttnPolicy policy =
      policy_for(ex, tuning, shape.rows_per_item, 32, kGqaMinChunk, kGqaMaxSplits);
  const launch::AttnBounds bounds = launch::attn_bounds(policy, N, B, a.max_pages * ps);
  check_bounds(fn, bounds, N, a.max_pages * ps);

  const size_t sched_bytes = align256(launch::attn_schedule_bytes(bounds, N, B));
  const size_t acc_bytes = align256(static_cast<size_t>(bounds.parts) * hq * dv * 4);
  const size_t ml_bytes = align256(static_cast<size_t>(bounds.parts) * hq * 2 * 4);
  const CallBuffer buf(ex, sched_bytes + acc_bytes + ml_bytes);
  a.sched = launch::attn_schedule_carve(buf.get(), bounds, N, B);
  a.part_acc = reinterpret_cast<float*>(buf.get() + sched_bytes);
  a.part_ml = reinterpret_cast<float*>(buf.get() + sched_bytes + acc_bytes);

  const cudaStream_t stream = stream_of(ex);
  launch::attn_schedule(stream, policy, a.cu, a.past, N, B, a.sched);
  launch::attn_simt(stream, a, qpw, bounds.items);
  launch::attn_combine(stream, a, bounds.split_rows, /*spread=*/false);
}

// ---- MLA ------------------------------------------------------------------------------------

struct MlaCall {
  launch::AttnArgs a;  // the latent attention (q, o: filled in by the caller)
  int64_t N = 0, B = 0;
};

MlaCall check_latent(const char* fn, const Tensor& latent_pool, const Tensor& rope_pool,
                     const Tensor& page_table, const Tensor& cu_seqlens, const Tensor& past_lens,
                     int64_t N, int64_t H, int64_t R, int64_t dr, float scale) {
  LOOM_CHECK_CUDA_ARG(fn, latent_pool);
  const int64_t B = check_step(fn, page_table, cu_seqlens, past_lens);
  // fp8 pools: rows of R (dr) codes and a 4-byte scale (kernels/attention.h).
  const DType kv = latent_pool.dtype();
  LOOM_CHECK(is_pool(kv) && latent_pool.is_contiguous() && latent_pool.ndim() == 3 &&
                 latent_pool.dim(2) == kv_pool_last_dim(kv, R) && latent_pool.dim(1) > 0,
             "%s: latent_pool %s, expected contiguous f32, bf16 or fp8 [pages, page_size, %lld]",
             fn, latent_pool.describe().c_str(), static_cast<long long>(kv_pool_last_dim(kv, R)));
  if (dr > 0) {
    LOOM_CHECK_CUDA_ARG(fn, rope_pool);
    LOOM_CHECK(rope_pool.dtype() == kv && rope_pool.is_contiguous() && rope_pool.ndim() == 3 &&
                   rope_pool.dim(0) == latent_pool.dim(0) &&
                   rope_pool.dim(1) == latent_pool.dim(1) &&
                   rope_pool.dim(2) == kv_pool_last_dim(kv, dr),
               "%s: rope_pool %s, expected contiguous [%lld, %lld, %lld] of latent_pool's dtype",
               fn, rope_pool.describe().c_str(), static_cast<long long>(latent_pool.dim(0)),
               static_cast<long long>(latent_pool.dim(1)),
               static_cast<long long>(kv_pool_last_dim(kv, dr)));
  }
  LOOM_CHECK(H > 0 && H <= 65535 && R > 0 && R <= 65535 && dr >= 0 && dr <= 65535,
             "%s: H = %lld, R = %lld, dr = %lld", fn, static_cast<long long>(H),
             static_cast<long long>(R), static_cast<long long>(dr));
  MlaCall c;
  c.N = N;
  c.B = B;
  launch::AttnArgs& a = c.a;
  a.q_row = H * (R + dr);
  a.q_head = R + dr;
  a.k1 = latent_pool.raw();
  a.k1_row = latent_pool.dim(2);
  a.k2 = dr > 0 ? rope_pool.raw() : nullptr;
  a.k2_row = dr > 0 ? rope_pool.dim(2) : 0;
  a.v = nullptr;
  a.kv_bf16 = kv == DType::kBF16;
  a.kv_fp8 = kv == DType::kF8E4M3;
  a.d1 = static_cast<int>(R);
  a.d2 = static_cast<int>(dr);
  a.dv = static_cast<int>(R);
  a.heads = static_cast<int>(H);
  a.groups = 1;
  a.o_row = H * R;
  a.o_head = R;
  a.page_table = page_table.data<int32_t>();
  a.max_pages = page_table.dim(1);
  a.page_size = latent_pool.dim(1);
  a.num_pages = latent_pool.dim(0);
  a.cu = cu_seqlens.data<int64_t>();
  a.past = past_lens.data<int64_t>();
  a.scale = scale;
  return c;
}

// The latent attention's path, policy and bounds.
enum class LatentPath { kSimt, kTc, kWgmma };
struct LatentPlan {
  LatentPath path = LatentPath::kSimt;
  int bn = 64, stages = 2;
  launch::AttnPolicy policy;
  launch::AttnBounds bounds;
};

LatentPlan plan_latent(const char* fn, const Exec& ex, const MlaCall& c, const AttentionTuning& t) {
  LatentPlan p;
  const bool tc_ok = launch::mla_tc_supported(c.a);
  const char* pools = c.a.kv_fp8 ? "fp8" : c.a.kv_bf16 ? "bf16" : "f32";
  LOOM_CHECK(t.mla_path != 2 || tc_ok,
             "%s: the tensor-core path needs bf16 or fp8 pools, R = 512 and dr = 64 (%s pools, "
             "R = %d, dr = %d)",
             fn, pools, c.a.d1, c.a.d2);
  // fp8 pools take the wgmma kernel's fp8 variant (bulk copies of the raw rows, widened to bf16
  // tiles in shared memory) where it runs, else the mma.sync kernel; both in 64-key tiles.
  const bool wgmma_ok = tc_ok && launch::mla_wgmma_supported(c.a);
  LOOM_CHECK(t.mla_path != 3 || wgmma_ok,
             "%s: the wgmma path needs a compute capability 9.0 device, bf16 or fp8 pools (fp8: "
             "contiguous rows of 516 and 68 bytes, 16-byte aligned), R = 512 and dr = 64 (%s "
             "pools, R = %d, dr = %d)",
             fn, pools, c.a.d1, c.a.d2);
  const int bn = t.tc_keys == 32 ? 32 : 64;
  // By shape: the wgmma kernel where its tiles never cross a page (they are TMA boxes then).
  if (t.mla_path == 3 || (t.mla_path == 0 && wgmma_ok && c.a.page_size % bn == 0)) {
    p.path = LatentPath::kWgmma;
  } else if (t.mla_path == 2 || (t.mla_path == 0 && tc_ok)) {
    p.path = LatentPath::kTc;
  }
  // Only the tensor-core paths tile keys (the CUDA-core one takes fp8 with any tuning).
  LOOM_CHECK(!c.a.kv_fp8 || p.path == LatentPath::kSimt || bn == 64,
             "%s: fp8 pools take 64-key tiles only on the tensor-core paths", fn);
  int rows_per_item = 1, key_block = 32;
  if (p.path == LatentPath::kWgmma) {
    p.bn = bn;
    p.stages = bn == 64 ? 2 : 4;
    key_block = p.bn;
  } else if (p.path == LatentPath::kTc) {
    p.bn = bn;
    p.stages = p.bn == 64 ? 2 : (t.tc_stages == 3 ? 3 : 4);
    key_block = p.bn;
  } else {
    LOOM_CHECK(launch::attn_simt_fits(c.a, 4),
               "%s: latent dim R = %d, rope dim dr = %d need more shared memory than a block "
               "has (R <= 512)",
               fn, c.a.d1, c.a.d2);
    rows_per_item = launch::attn_simt_shape(c.a, 4).rows_per_item;
  }
  p.policy = policy_for(ex, t, rows_per_item, key_block, kMlaMinChunk, kMlaMaxSplits);
  // The default mode's tensor-core paths size their splits by the batch (attention_launch.h,
  // AttnPolicy): the floor one key tile, the rest chosen on the device from the lengths.
  if (p.policy.split_rows > 0 && p.path != LatentPath::kSimt && t.split != 1 && t.min_chunk == 0) {
    const int64_t htiles = (c.a.heads + 31) / 32;  // both kernels take 32 heads a unit
    const int64_t resident = p.path == LatentPath::kWgmma
                                 ? launch::mla_wgmma_resident(p.bn, c.a.kv_fp8)
                                 : launch::mla_tc_resident(p.bn, p.stages, c.a.kv_fp8);
    // A key's cache bytes: bf16 pools, or fp8 ones with their two scales.
    const int64_t key_bytes = c.a.kv_fp8 ? static_cast<int64_t>(c.a.d1 + c.a.d2) + 8
                                         : static_cast<int64_t>(c.a.d1 + c.a.d2) * 2;
    launch::AttnPolicy& q = p.policy;
    q.min_chunk = key_block;
    q.wave_items = static_cast<int>(std::max<int64_t>(1, resident / htiles));
    // A unit stages 32 heads of f32 queries; a partial is H x R f32, written then read back.
    q.unit_keys =
        static_cast<int>((int64_t{32} * (c.a.d1 + c.a.d2) * 4 + key_bytes - 1) / key_bytes);
    q.part_keys = static_cast<int>((2 * int64_t{c.a.heads} * c.a.dv * 4 + htiles * key_bytes - 1) /
                                   (htiles * key_bytes));
    q.max_parts = std::max(kMlaPartWaves * q.wave_items, q.max_splits);
  }
  p.bounds = launch::attn_bounds(p.policy, c.N, c.B, c.a.max_pages * c.a.page_size);
  check_bounds(fn, p.bounds, c.N, c.a.max_pages * c.a.page_size);
  return p;
}

// Calls the wgmma kernel has run over fp8 pools, process-wide (mla_wgmma_fp8_calls_run()).
std::atomic<uint64_t> g_wgmma_fp8_calls{0};

void run_latent(cudaStream_t stream, const launch::AttnArgs& a, const LatentPlan& p, int64_t N,
                int64_t B) {
  launch::attn_schedule(stream, p.policy, a.cu, a.past, N, B, a.sched);
  if (a.probe == 5) return;  // benchmarks: the schedule alone
  switch (p.path) {
    case LatentPath::kWgmma:
      if (a.kv_fp8) g_wgmma_fp8_calls.fetch_add(1, std::memory_order_relaxed);
      launch::mla_attn_wgmma(stream, a, p.bounds.items, p.bn);
      break;
    case LatentPath::kTc:
      launch::mla_attn_tc(stream, a, p.bounds.items, p.bn, p.stages);
      break;
    case LatentPath::kSimt:
      launch::attn_simt(stream, a, 4, p.bounds.items);
      break;
  }
}

// The absorbed path's call buffer (mla()), in carving order: the schedule, latent queries and
// outputs, split partials, and kv_b rounded to bf16 where its projections are bf16 GEMMs.
struct AbsorbedBuffer {
  size_t sched, qlat, olat, acc, ml, kv16;
  size_t total() const { return sched + qlat + olat + acc + ml + kv16; }
};
AbsorbedBuffer absorbed_buffer(const LatentPlan& p, int64_t N, int64_t B, int64_t H, int64_t R,
                               int64_t dr, int64_t dn, int64_t dv, bool bf16_gemms) {
  return {align256(launch::attn_schedule_bytes(p.bounds, N, B)),
          align256(static_cast<size_t>(N) * H * (R + dr) * 4),
          align256(static_cast<size_t>(N) * H * R * 4),
          align256(static_cast<size_t>(p.bounds.parts) * H * R * 4),
          align256(static_cast<size_t>(p.bounds.parts) * H * 2 * 4),
          bf16_gemms ? align256(static_cast<size_t>(H) * (dn + dv) * R * 2) : 0};
}

// ---- MLA, expanded form -----------------------------------------------------------------------

// Sequences the expanded form has run, process-wide (mla_expanded_sequences_run()).
std::atomic<uint64_t> g_expanded_sequences{0};

// Keys per expansion block at least (a block's GEMM and attention pass should be long enough to
// fill the GPU); a chunk of T new rows takes max(T, this) keys a block, so the block's memory
// follows the step's rows and not its context.
constexpr int64_t kMlaExpandedMinKeyBlock = 4096;

// bf16 pools are gathered as they are; fp8 ones dequantized into the bf16 rows the GEMM reads.
bool mla_expanded_shapes(const Tensor& latent_pool, const MlaDims& dims) {
  return (latent_pool.dtype() == DType::kBF16 || latent_pool.dtype() == DType::kF8E4M3) &&
         dims.latent_dim % 8 == 0 &&
         launch::mla_expanded_supported(static_cast<int>(dims.nope_dim),
                                        static_cast<int>(dims.rope_dim),
                                        static_cast<int>(dims.v_dim));
}

// Which sequences take the expanded form (empty: none does).
std::vector<char> mla_expanded_sequences(const Exec& ex, const Tensor& latent_pool,
                                         const MlaDims& dims, const AttentionTuning& tuning,
                                         const VarlenHostLens& host, int64_t B) {
  if (!host.known() || tuning.mla_form == 1 || ex.batch_invariant ||
      !mla_expanded_shapes(latent_pool, dims))
    return {};
  std::vector<char> expanded(B, 0);
  bool any = false;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t T = host.cu_seqlens[b + 1] - host.cu_seqlens[b], P = host.past_lens[b];
    expanded[b] = T > 0 && (tuning.mla_form == 2 ||
                            (T >= kMlaExpandedMinRows &&
                             mla_attention_form(T, P + T, dims, false) == MlaForm::kExpanded));
    any = any || expanded[b];
  }
  if (!any) return {};
  return expanded;
}

void mla(const Exec& ex, const Tensor& q, const Tensor& latent_pool, const Tensor& rope_pool,
         const Tensor& page_table, const Tensor& cu_seqlens, const Tensor& past_lens,
         const Tensor& kv_b, const MlaDims& dims, float scale, const Tensor& out,
         const AttentionTuning& tuning, const VarlenHostLens& host);

// The call with some sequences in the expanded form (`expanded`): the others first, as absorbed
// sub-batches (each maximal run of them, its row offsets shifted to start at 0), then each
// expanded sequence over its keys in blocks: gather the block's latent and rope rows out of the
// pages, expand them with kv_b (one bf16 GEMM: k_nope and v of every head), attend.
void mla_mixed(const char* fn, const Exec& ex, const MlaCall& c, const Tensor& q,
               const Tensor& latent_pool, const Tensor& rope_pool, const Tensor& page_table,
               const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& kv_b,
               const MlaDims& dims, float scale, const Tensor& out, const AttentionTuning& tuning,
               const VarlenHostLens& host, const std::vector<char>& expanded) {
  const int64_t B = static_cast<int64_t>(expanded.size());
  const int64_t* cu = host.cu_seqlens;
  const cudaStream_t stream = stream_of(ex);
  const int64_t ps = latent_pool.dim(1), cols = page_table.dim(1);
  // The host lens must describe the call (the device tensors are not read back to compare).
  LOOM_CHECK(cu[0] == 0 && cu[B] == c.N, "%s: host cu_seqlens run from %lld to %lld for %lld rows",
             fn, static_cast<long long>(cu[0]), static_cast<long long>(cu[B]),
             static_cast<long long>(c.N));
  for (int64_t b = 0; b < B; ++b) {
    LOOM_CHECK(cu[b + 1] >= cu[b] && host.past_lens[b] >= 0 &&
                   host.past_lens[b] + (cu[b + 1] - cu[b]) <= cols * ps,
               "%s: sequence %lld: %lld rows after %lld cached positions do not fit its %lld "
               "page-table columns of %lld",
               fn, static_cast<long long>(b), static_cast<long long>(cu[b + 1] - cu[b]),
               static_cast<long long>(host.past_lens[b]), static_cast<long long>(cols),
               static_cast<long long>(ps));
  }
  for (int64_t b0 = 0; b0 < B;) {
    if (expanded[b0]) {
      ++b0;
      continue;
    }
    int64_t b1 = b0;
    while (b1 < B && !expanded[b1]) ++b1;
    if (cu[b1] > cu[b0]) {
      const CallBuffer cu_buf(ex, static_cast<size_t>(b1 - b0 + 1) * 8);
      launch::shift_offsets(stream, cu_seqlens.data<int64_t>() + b0, b1 - b0 + 1,
                            reinterpret_cast<int64_t*>(cu_buf.get()));
      const Tensor sub_cu =
          Tensor::wrap(cu_buf.get(), {b1 - b0 + 1}, DType::kI64, cu_seqlens.device());
      mla(ex, q.slice(0, cu[b0], cu[b1]), latent_pool, rope_pool, page_table.slice(0, b0, b1),
          sub_cu, past_lens.slice(0, b0, b1), kv_b, dims, scale, out.slice(0, cu[b0], cu[b1]),
          tuning, VarlenHostLens{});
    }
    b0 = b1;
  }

  const int64_t H = dims.heads, dn = dims.nope_dim, dr = dims.rope_dim, dv = dims.v_dim,
                R = dims.latent_dim, dq = dn + dr, kvw = H * (dn + dv);
  const bool act_bf16 = q.dtype() == DType::kBF16;
  // Keys per expansion block of a sequence of T new rows.
  const auto key_block = [&](int64_t T) {
    if (tuning.mla_key_block > 0) return tuning.mla_key_block;
    return (std::max(T, kMlaExpandedMinKeyBlock) + 63) / 64 * 64;
  };
  int64_t max_rows = 0, max_block = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (!expanded[b]) continue;
    max_rows = std::max(max_rows, cu[b + 1] - cu[b]);
    max_block = std::max(max_block, key_block(cu[b + 1] - cu[b]));
  }
  const size_t kv16_bytes = align256(static_cast<size_t>(kvw) * R * 2);
  const size_t q16_bytes = act_bf16 ? 0 : align256(static_cast<size_t>(max_rows) * H * dq * 2);
  const size_t lat_bytes = align256(static_cast<size_t>(max_block) * R * 2);
  const size_t rope_bytes = align256(static_cast<size_t>(max_block) * dr * 2);
  const size_t kvx_bytes = align256(static_cast<size_t>(max_block) * kvw * 2);
  // The running state across key blocks, taken whatever the context so that the step memory the
  // engine profiles (one prefill from position 0: one block) covers long contexts too.
  const size_t acc_bytes = align256(static_cast<size_t>(max_rows) * H * dv * 4);
  const size_t ml_bytes = align256(static_cast<size_t>(max_rows) * H * 2 * 4);
  size_t total = kv16_bytes + q16_bytes + lat_bytes + rope_bytes + kvx_bytes + acc_bytes + ml_bytes;
  // At least what the absorbed form would take for as many rows, each its own sequence (the most
  // split partials), so that the step memory the engine profiles (one prefill from position 0,
  // which runs here) also covers a step whose rows all run absorbed (many short chunks).
  {
    MlaCall worst = c;
    worst.N = max_rows;
    worst.B = max_rows;
    const LatentPlan wp = plan_latent(fn, ex, worst, tuning);
    total =
        std::max(total, absorbed_buffer(wp, max_rows, max_rows, H, R, dr, dn, dv, true).total());
  }
  const CallBuffer buf(ex, total);
  char* at = buf.get();
  auto carve = [&](size_t bytes) {
    char* p = at;
    at += bytes;
    return p;
  };
  void* kv16 = carve(kv16_bytes);
  void* q16 = carve(q16_bytes);
  void* lat = carve(lat_bytes);
  void* rope = carve(rope_bytes);
  void* kvx = carve(kvx_bytes);
  float* acc = reinterpret_cast<float*>(carve(acc_bytes));
  float* ml = reinterpret_cast<float*>(carve(ml_bytes));
  launch::copy_2d(stream, kv16, true, R, kv_b.raw(), false, R, kvw, R);

  for (int64_t b = 0; b < B; ++b) {
    if (!expanded[b]) continue;
    g_expanded_sequences.fetch_add(1, std::memory_order_relaxed);
    const int64_t r0 = cu[b], T = cu[b + 1] - cu[b], P = host.past_lens[b], S = P + T;
    const int64_t kb = key_block(T);
    launch::MlaExpandedArgs a;
    if (act_bf16) {
      a.q = static_cast<const char*>(q.raw()) + r0 * H * dq * 2;
    } else {
      launch::copy_2d(stream, q16, true, H * dq, q.data<float>() + r0 * H * dq, false, H * dq, T,
                      H * dq);
      a.q = q16;
    }
    a.q_row = H * dq;
    a.kv = kvx;
    a.kv_row = kvw;
    a.k_rope = rope;
    a.rope_row = dr;
    a.T = static_cast<int>(T);
    a.H = static_cast<int>(H);
    a.dn = static_cast<int>(dn);
    a.dr = static_cast<int>(dr);
    a.dv = static_cast<int>(dv);
    a.past = P;
    a.scale = scale;
    a.acc = acc;
    a.ml = ml;
    a.out = static_cast<char*>(out.raw()) + r0 * H * dv * (act_bf16 ? 2 : 4);
    a.out_row = H * dv;
    a.out_f32 = !act_bf16;
    for (int64_t k0 = 0; k0 < S; k0 += kb) {
      const int64_t nk = std::min(kb, S - k0);
      launch::mla_gather_keys(
          stream, latent_pool.raw(), rope_pool.raw(), R, dr, latent_pool.dtype() == DType::kF8E4M3,
          page_table.data<int32_t>() + b * cols, ps, latent_pool.dim(0), k0, nk, lat, rope);
      gemm_strided_batched(ex, 1, nk, kvw, R, lat, GemmElem::kBF16, R, 0, kv16, GemmElem::kBF16, R,
                           0, /*trans_b=*/true, kvx, GemmElem::kBF16, kvw, 0);
      a.key0 = k0;
      a.nk = nk;
      a.first = k0 == 0;
      a.last = k0 + nk >= S;
      launch::mla_expanded_attention(stream, a);
    }
  }
}

void mla(const Exec& ex, const Tensor& q, const Tensor& latent_pool, const Tensor& rope_pool,
         const Tensor& page_table, const Tensor& cu_seqlens, const Tensor& past_lens,
         const Tensor& kv_b, const MlaDims& dims, float scale, const Tensor& out,
         const AttentionTuning& tuning, const VarlenHostLens& host) {
  const char* fn = "mla_attention_varlen";
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, kv_b);
  LOOM_CHECK_CUDA_ARG(fn, out);
  const int64_t H = dims.heads, dn = dims.nope_dim, dr = dims.rope_dim, dv = dims.v_dim,
                R = dims.latent_dim;
  LOOM_CHECK(H > 0 && dn > 0 && dr >= 0 && dv > 0 && R > 0,
             "%s: bad dims H=%lld dn=%lld dr=%lld dv=%lld R=%lld", fn, static_cast<long long>(H),
             static_cast<long long>(dn), static_cast<long long>(dr), static_cast<long long>(dv),
             static_cast<long long>(R));
  LOOM_CHECK(is_act(q.dtype()) && out.dtype() == q.dtype() && q.is_contiguous() &&
                 out.is_contiguous() && q.ndim() == 3,
             "%s: q %s out %s, expected contiguous f32 or bf16, the same for both", fn,
             q.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(kv_b.dtype() == DType::kF32 && kv_b.is_contiguous(),
             "%s: kv_b %s, expected contiguous f32", fn, kv_b.describe().c_str());
  const int64_t N = q.dim(0);
  LOOM_CHECK_SHAPE(q, N, H, dn + dr);
  LOOM_CHECK_SHAPE(kv_b, H * (dn + dv), R);
  LOOM_CHECK_SHAPE(out, N, H, dv);
  LOOM_CHECK(dn <= 4096 && dv <= 65535, "%s: dn = %lld, dv = %lld too large", fn,
             static_cast<long long>(dn), static_cast<long long>(dv));
  MlaCall c = check_latent(fn, latent_pool, rope_pool, page_table, cu_seqlens, past_lens, N, H, R,
                           dr, scale);
  if (N == 0 || c.B == 0) return;
  LOOM_CHECK(tuning.mla_form != 2 ||
                 (host.known() && !ex.batch_invariant && mla_expanded_shapes(latent_pool, dims)),
             "%s: the expanded form needs the host lens, bf16 or fp8 pools, dn = dv = 128, "
             "dr = 64 and not batch-invariant numerics",
             fn);
  const std::vector<char> expanded =
      mla_expanded_sequences(ex, latent_pool, dims, tuning, host, c.B);
  if (!expanded.empty()) {
    return mla_mixed(fn, ex, c, q, latent_pool, rope_pool, page_table, cu_seqlens, past_lens, kv_b,
                     dims, scale, out, tuning, host, expanded);
  }
  const LatentPlan p = plan_latent(fn, ex, c, tuning);
  const bool act_bf16 = q.dtype() == DType::kBF16;
  // Prefill-sized calls map q into the latent space and the result back out with one cuBLAS GEMM
  // per head on the tensor cores: Loom's projection kernels below (CUDA cores, f32 kv_b) took 55
  // of an 8192-token prefill's ~260 ms on the 48B-shaped model (about 8 TFLOP/s; ncu, s18a).
  // Only where the attention's own rows already depend on the batch (the tensor-core paths' splits
  // sized by it, the default mode's): cuBLAS picks its kernel by N, so a row's bits would, and
  // the CUDA-core path and per-length splits keep that invariance (and batch-invariant mode).
  // Calls with no sequence of several rows (decode batches, however large) keep the kernels too:
  // the GEMMs' bf16 path would round all of kv_b again every step. With bf16 activations both
  // GEMMs read bf16 (q as it is, kv_b rounded into the call's buffer, o_lat into q_lat's, dead
  // once the attention has read it); with f32 ones they are true f32 GEMMs.
  const bool gemm_projections = !ex.batch_invariant && p.policy.wave_items > 0 &&
                                N > kMlaGemmMinRows && N > c.B && !projection_kernels_from_env();
  const bool bf16_gemms = gemm_projections && act_bf16;

  const AbsorbedBuffer sizes = absorbed_buffer(p, N, c.B, H, R, dr, dn, dv, bf16_gemms);
  const CallBuffer buf(ex, sizes.total());
  char* at = buf.get();
  launch::AttnArgs& a = c.a;
  a.probe = tuning.probe;
  a.sync_handoff = tuning.sync_handoff || sync_handoff_from_env();
  a.sched = launch::attn_schedule_carve(at, p.bounds, N, c.B);
  at += sizes.sched;
  float* q_lat = reinterpret_cast<float*>(at);
  at += sizes.qlat;
  float* o_lat = reinterpret_cast<float*>(at);
  at += sizes.olat;
  a.part_acc = reinterpret_cast<float*>(at);
  at += sizes.acc;
  a.part_ml = reinterpret_cast<float*>(at);
  at += sizes.ml;
  uint16_t* kv16 = reinterpret_cast<uint16_t*>(at);
  // N H R bf16 fit in q_lat's N H (R + dr) f32.
  uint16_t* o16 = reinterpret_cast<uint16_t*>(q_lat);
  a.q = q_lat;
  a.o = o_lat;

  const cudaStream_t stream = stream_of(ex);
  // kv_b's rows for head h: [h (dn + dv), h (dn + dv) + dn) take q_nope into the latent space,
  // the dv after them take the latent output to the value dims.
  const int64_t dq = dn + dr, head_rows = dn + dv;
  const GemmElem proj_elem = bf16_gemms ? GemmElem::kBF16 : GemmElem::kF32;
  const void* kv_proj = kv_b.raw();
  if (bf16_gemms) {
    launch::copy_2d(stream, kv16, true, R, kv_b.raw(), false, R, H * head_rows, R);
    kv_proj = kv16;
  }
  const size_t proj_size = bf16_gemms ? 2 : 4;
  if (gemm_projections) {
    gemm_strided_batched(ex, H, N, R, dn, q.raw(), act_bf16 ? GemmElem::kBF16 : GemmElem::kF32,
                         H * dq, dq, kv_proj, proj_elem, R, head_rows * R, /*trans_b=*/false, q_lat,
                         GemmElem::kF32, H * (R + dr), R + dr);
    if (dr > 0)
      launch::copy_2d(stream, q_lat + R, false, R + dr,
                      static_cast<const char*>(q.raw()) + dn * (act_bf16 ? 2 : 4), act_bf16, dq,
                      N * H, dr);
  } else {
    launch::mla_absorb_q(stream, q.raw(), act_bf16, kv_b.data<float>(), q_lat, N, H, dn, dr, dv, R);
  }
  run_latent(stream, a, p, N, c.B);
  if (gemm_projections) {
    if (p.bounds.split_rows > 0) launch::attn_combine(stream, a, p.bounds.split_rows, true);
    const void* o_proj = o_lat;
    if (bf16_gemms) {
      launch::copy_2d(stream, o16, true, R, o_lat, false, R, N * H, R);
      o_proj = o16;
    }
    gemm_strided_batched(ex, H, N, dv, R, o_proj, proj_elem, H * R, R,
                         static_cast<const char*>(kv_proj) + dn * R * proj_size, proj_elem, R,
                         head_rows * R, /*trans_b=*/true, out.raw(),
                         act_bf16 ? GemmElem::kBF16 : GemmElem::kF32, H * dv, dv);
    return;
  }
  // Few rows: the projection splits each row's value dims over several blocks, each of which
  // would combine the row's partials again; combine them once, into o_lat, first.
  // Only where splits are sized by the batch already (occupancy): elsewhere a row's bits must not
  // depend on how many rows come with it, and this choice does.
  const bool by_batch = p.policy.wave_items > 0;
  const bool combine_first = by_batch && N <= 16 && p.bounds.split_rows > 0;
  if (combine_first) launch::attn_combine(stream, a, p.bounds.split_rows, /*spread=*/true);
  launch::mla_project_out(stream, o_lat, combine_first ? nullptr : a.part_acc, a.part_ml, a.sched,
                          kv_b.data<float>(), out.raw(), act_bf16, N, H, dn, dv, R);
}

}  // namespace

void gqa_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out) {
  gqa(ex, q, k_pool, v_pool, page_table, cu_seqlens, past_lens, scale, out, AttentionTuning{});
}

void gqa_attention_varlen_tuned(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                                const Tensor& v_pool, const Tensor& page_table,
                                const Tensor& cu_seqlens, const Tensor& past_lens, float scale,
                                const Tensor& out, const AttentionTuning& tuning) {
  gqa(ex, q, k_pool, v_pool, page_table, cu_seqlens, past_lens, scale, out, tuning);
}

void mla_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                          const Tensor& rope_pool, const Tensor& page_table,
                          const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& kv_b,
                          const MlaDims& dims, float scale, const Tensor& out,
                          const VarlenHostLens& host) {
  mla(ex, q, latent_pool, rope_pool, page_table, cu_seqlens, past_lens, kv_b, dims, scale, out,
      AttentionTuning{}, host);
}

uint64_t mla_wgmma_fp8_calls_run() { return g_wgmma_fp8_calls.load(std::memory_order_relaxed); }

uint64_t mla_expanded_sequences_run() {
  return g_expanded_sequences.load(std::memory_order_relaxed);
}

void mla_attention_varlen_tuned(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                                const Tensor& rope_pool, const Tensor& page_table,
                                const Tensor& cu_seqlens, const Tensor& past_lens,
                                const Tensor& kv_b, const MlaDims& dims, float scale,
                                const Tensor& out, const AttentionTuning& tuning,
                                const VarlenHostLens& host) {
  mla(ex, q, latent_pool, rope_pool, page_table, cu_seqlens, past_lens, kv_b, dims, scale, out,
      tuning, host);
}

void mla_latent_attention_varlen(const Exec& ex, const Tensor& q_lat, const Tensor& latent_pool,
                                 const Tensor& rope_pool, const Tensor& page_table,
                                 const Tensor& cu_seqlens, const Tensor& past_lens, float scale,
                                 const Tensor& o_lat, const AttentionTuning& tuning) {
  const char* fn = "mla_latent_attention_varlen";
  LOOM_CHECK_CUDA_ARG(fn, q_lat);
  LOOM_CHECK_CUDA_ARG(fn, o_lat);
  LOOM_CHECK(q_lat.dtype() == DType::kF32 && o_lat.dtype() == DType::kF32 &&
                 q_lat.is_contiguous() && o_lat.is_contiguous() && q_lat.ndim() == 3 &&
                 o_lat.ndim() == 3 && latent_pool.ndim() == 3,
             "%s: q_lat %s o_lat %s latent_pool %s", fn, q_lat.describe().c_str(),
             o_lat.describe().c_str(), latent_pool.describe().c_str());
  const int64_t N = q_lat.dim(0), H = q_lat.dim(1), R = kv_pool_vector_dim(latent_pool),
                dr = q_lat.dim(2) - R;
  LOOM_CHECK(dr >= 0, "%s: q_lat %s shorter than the latent %lld", fn, q_lat.describe().c_str(),
             static_cast<long long>(R));
  LOOM_CHECK_SHAPE(o_lat, N, H, R);
  MlaCall c = check_latent(fn, latent_pool, rope_pool, page_table, cu_seqlens, past_lens, N, H, R,
                           dr, scale);
  if (N == 0 || c.B == 0) return;
  const LatentPlan p = plan_latent(fn, ex, c, tuning);
  const size_t sched_bytes = align256(launch::attn_schedule_bytes(p.bounds, N, c.B));
  const size_t acc_bytes = align256(static_cast<size_t>(p.bounds.parts) * H * R * 4);
  const size_t ml_bytes = align256(static_cast<size_t>(p.bounds.parts) * H * 2 * 4);
  const CallBuffer buf(ex, sched_bytes + acc_bytes + ml_bytes);
  launch::AttnArgs& a = c.a;
  a.probe = tuning.probe;
  a.sync_handoff = tuning.sync_handoff || sync_handoff_from_env();
  a.sched = launch::attn_schedule_carve(buf.get(), p.bounds, N, c.B);
  a.part_acc = reinterpret_cast<float*>(buf.get() + sched_bytes);
  a.part_ml = reinterpret_cast<float*>(buf.get() + sched_bytes + acc_bytes);
  a.q = q_lat.raw();
  a.o = o_lat.raw();
  const cudaStream_t stream = stream_of(ex);
  run_latent(stream, a, p, N, c.B);
  if (a.probe == 5 || a.probe == 6) return;  // benchmarks: without the combine
  launch::attn_combine(stream, a, p.bounds.split_rows, /*spread=*/p.policy.wave_items > 0);
}

}  // namespace loom::cuda
