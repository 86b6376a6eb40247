// Raw launcher of the expanded-form MLA prefill kernel (kernels/cuda/attention_mla_expanded.cu).
// Like launch.h this header includes no Loom or Abseil header, so nvcc never parses Abseil.
//
// What: causal flash attention of one sequence's new rows over one block of its keys, in MLA's
// expanded form (every head has its own k_nope and v, decompressed from the latent; the rope key
// part is shared by all heads), with the online-softmax state carried across launches over
// consecutive key blocks, so that a caller can walk a long context (a 1M-token prompt) in blocks
// of keys it expands one at a time.
// Why: for long prefill chunks the expanded form costs dn + dr + dv = 320 multiply-adds per key
// and head against the absorbed form's 2 R + dr = 1088 (R = 512), and runs on tensor cores at
// flash-attention rates (expanding each key block is the caller's GEMM).
// Precision: q, k, v are bf16 as given; scores, the softmax state (max in log2 units, sum) and the
// output accumulators are f32; the probabilities are rounded to bf16 for P V, as flash attention
// does (relative error of each weight <= 2^-8, so |out error| <= 2^-8 max|v| at worst).
// Speed (tests/gpu/mla_expanded_cuda_bench.cc, H200, H = 32): 268-281 TFLOP/s on long causal
// problems (T = 8192 and 16384 fresh; T = 8192 after 122880 keys in blocks of 16384), 27-28% of
// the dense bf16 peak; PyTorch's SDPA flash backend 245-268 on the same shapes (details and the
// cuDNN peer in the .cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// One sequence's causal attention in MLA's expanded form over one block of its keys.
struct MlaExpandedArgs {
  // bf16: query row i, head h at q + i * q_row + h * (dn + dr): [q_nope (dn) | q_rope (dr)]
  const void* q = nullptr;
  int64_t q_row = 0;  // elements
  // bf16: key j (0 <= j < nk, block-relative) head h: k_nope at kv + j * kv_row + h * (dn + dv),
  // v right after it (dv values)
  const void* kv = nullptr;
  int64_t kv_row = 0;  // elements (H * (dn + dv) when packed)
  // bf16: key j's rope part (dr values, shared by every head) at k_rope + j * rope_row
  const void* k_rope = nullptr;
  int64_t rope_row = 0;
  int T = 0, H = 0, dn = 0, dr = 0, dv = 0;
  // Query row i is at absolute position past + i and sees keys at positions <= past + i.
  int64_t past = 0;
  int64_t key0 = 0, nk = 0;  // this launch's keys are at absolute positions [key0, key0 + nk)
  float scale = 1.0f;        // score = scale * (q_nope . k_nope + q_rope . k_rope)
  // Running state across launches over consecutive key blocks (key0 increasing, first block
  // key0 = 0):
  float* acc = nullptr;  // f32 [T, H, dv]: unnormalised output so far (unused when first && last)
  // f32 [T, H, 2]: running max (log2 units) and running sum (unused when first && last)
  float* ml = nullptr;
  bool first = true;    // no earlier block: start from nothing (do not read acc/ml)
  bool last = true;     // write out = acc / sum (else store acc, ml for the next launch)
  void* out = nullptr;  // [T, H, dv] at out + i * out_row + h * dv; bf16, or f32 with out_f32
  int64_t out_row = 0;
  bool out_f32 = false;
};

// Whether the kernel is built for these head dims: (dn, dr, dv) = (128, 64, 128).
bool mla_expanded_supported(int dn, int dr, int dv);

// Enqueues the block on `stream` (no synchronisation). Rows that see none of the block's keys keep
// their state bit for bit; with `last` every row is normalised and written (a row with no key at
// all gets 0). T = 0, or nk = 0 unless last && !first, does nothing. Aborts with a message on
// unsupported dims, pointers not 16-byte aligned, row strides not multiples of 8 elements, a
// non-positive scale, missing acc/ml/out where they are needed, or an empty first block that is
// not also the last (it would leave the state uninitialised).
void mla_expanded_attention(cudaStream_t stream, const MlaExpandedArgs& a);

}  // namespace loom::cuda::launch
