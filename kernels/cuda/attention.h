// CUDA twins of gqa_attention_varlen and mla_attention_varlen (kernels/attention.h): the same
// contracts, every tensor argument on the GPU and contiguous (page_table, cu_seqlens and
// past_lens too), enqueued on the Exec's stream without synchronising. The values of cu_seqlens,
// past_lens and page_table stay on the device and are not checked here (the CPU twins check
// them on the host); a page id outside the pool is not read.
//
// Dtypes: q and out f32 or bf16 (the same); pools f32, bf16 or fp8 (both the same; fp8 is
// kernels/attention.h's format, each vector's codes times its scale, dequantized as the key tiles
// load, never by a pass over the cache); kv_b f32; arithmetic in f32. MLA's two forms compute
// the same function:
//  - absorbed (decode, short chunks, and every sequence when the host lens are not given):
//    q_lat = W_UK^T q_nope, attention over the latent cache, out = W_UV o_lat. With a bf16 or fp8
//    cache, R = 512 and dr = 64 the attention runs on tensor cores (q, the softmax weights and
//    fp8 keys' dequantized values rounded to bf16 for the products, as flash attention does; fp8
//    on the mma.sync kernel, bf16 on the wgmma one where pages hold whole key tiles); otherwise
//    on CUDA cores in f32 (fp8 values exactly the host's).
//  - expanded (long prefill chunks): a sequence with host lens, at least kMlaExpandedMinRows new
//    rows and mla_attention_form's choice, bf16 or fp8 pools, dn = dv = 128 and dr = 64, not
//    batch-invariant. Its keys are gathered out of the pages in blocks (fp8 ones dequantized into
//    bf16 rows as they are gathered), expanded by one bf16 GEMM
//    with kv_b (k_nope and v of every head), and attended to per head on tensor cores
//    (attention_mla_expanded.cu): 640 FLOPs a query-key pair and head against the absorbed
//    form's 2176, which is what makes a 1M-token prefill feasible. The other sequences of the
//    call run in the absorbed form as sub-batches.
//
// Splits (flash-decoding). A sequence of at most 8 new rows splits its keys into chunks whose
// size is a function of its own length alone (launch::keys_per_split), combined afterwards, so a
// row's result never depends on the rest of the batch. In batch-invariant mode (ex.batch_invariant)
// nothing splits, so a row is also computed the same way in a prefill chunk of any size or in
// decode; long-context decode of a small batch is then slower.
//
// Temporaries (the schedule, partial results, MLA's latent-space queries and outputs) come from
// ex.workspace, or a stream-ordered allocation when it is null.
#pragma once

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void gqa_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out);

void mla_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                          const Tensor& rope_pool, const Tensor& page_table,
                          const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& kv_b,
                          const MlaDims& dims, float scale, const Tensor& out,
                          const VarlenHostLens& host = {});

// New rows a sequence needs before the expanded form is considered on the GPU: below it the
// per-sequence launches (a gather, a GEMM and an attention pass per key block) cost more than
// the absorbed form's batched kernels save.
inline constexpr int64_t kMlaExpandedMinRows = 128;
// Sequences MLA's expanded form has run since the process started (tests check that a call took
// it: the absorbed form computes the same function within their bounds).
uint64_t mla_expanded_sequences_run();
// Calls of MLA's absorbed form that the wgmma kernel ran over fp8 pages since the process
// started (tests check that fp8 decode took it rather than the mma.sync kernel).
uint64_t mla_wgmma_fp8_calls_run();

// Knobs for tests and benchmarks; zero fields keep the defaults the two ops above use. All but
// `probe` change only how the result is computed (and so its rounding); `probe` breaks it on
// purpose to time one half of the kernel, and only the benchmark sets it.
struct AttentionTuning {
  int mla_path = 0;    // 0: by shape; 1: CUDA cores; 2: tensor cores, mma.sync; 3: tensor cores,
                       // TMA + wgmma (Hopper); 2 and 3 need what they need
  int split = 0;       // 0: by path (MLA on tensor cores: by the batch's occupancy, the others
                       // by each sequence's length); 1: by each sequence's length alone
  int min_chunk = 0;   // keys per split at least (implies split = 1)
  int max_splits = 0;  // splits at most (1: never split)
  int tc_keys = 0;     // tensor-core key tile: 32 or 64
  int tc_stages = 0;   // mma.sync tile buffers: 2 (64 keys) or 3, 4 (32 keys); wgmma: fixed
  int gqa_qpw = 0;     // GQA query vectors per warp: 1 or 4
  int probe = 0;       // benchmarks only, wrong results: 1 times the arithmetic, 2 the loads,
                       // 3-6 parts of a call (attention_launch.h, AttnArgs::probe)
  bool sync_handoff = false;  // wgmma MLA: bar.sync on both sides of the P handoff (racecheck)
  // MLA's form, with host lens: 0 by cost and rows (mla_attention_varlen); 1 absorbed for every
  // sequence; 2 expanded for every sequence with rows (supported shapes; tests, benchmarks).
  int mla_form = 0;
  int64_t mla_key_block = 0;  // expanded form: keys per expansion block (0: the default)
};

void gqa_attention_varlen_tuned(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                                const Tensor& v_pool, const Tensor& page_table,
                                const Tensor& cu_seqlens, const Tensor& past_lens, float scale,
                                const Tensor& out, const AttentionTuning& tuning);
void mla_attention_varlen_tuned(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                                const Tensor& rope_pool, const Tensor& page_table,
                                const Tensor& cu_seqlens, const Tensor& past_lens,
                                const Tensor& kv_b, const MlaDims& dims, float scale,
                                const Tensor& out, const AttentionTuning& tuning,
                                const VarlenHostLens& host = {});

// MLA's attention core alone, queries already in latent space: q_lat [N, H, R + dr] f32
// ([W_UK^T q_nope | q_rope]), o_lat [N, H, R] f32 = softmax(scale (q_lat . [c | k_rope])) c.
// For benchmarks (the cache traffic without the projections) and tests.
void mla_latent_attention_varlen(const Exec& ex, const Tensor& q_lat, const Tensor& latent_pool,
                                 const Tensor& rope_pool, const Tensor& page_table,
                                 const Tensor& cu_seqlens, const Tensor& past_lens, float scale,
                                 const Tensor& o_lat, const AttentionTuning& tuning = {});

}  // namespace loom::cuda
