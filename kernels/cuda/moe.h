// CUDA twins of kernels/moe.h's forward ops: same contracts, every tensor argument on the GPU and
// contiguous, enqueued on the Exec's stream without synchronising. Index tensors (expert_ids,
// offsets, row_of_slot) stay on the device: what the CPU twins check from their values cannot be
// checked here, so each op says what a bad value does instead. Every op computes each output row
// by the same operations whatever else is in the call (batch-invariant in both numerics modes).
// Activations (x, x_sorted, y, out) are f32 or bf16, each on its own: read as f32, computed in f32,
// rounded to nearest even when stored as bf16. The backward ops have no CUDA twin yet (training
// runs on the CPU).
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"
#include "kernels/moe.h"

namespace loom::cuda {

// The CPU twin's ids and weights bit for bit (kernels/cuda/moe.cu says how). E <= 1024.
void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights);

// The CPU twin's ids, weights and counts bit for bit (counts [2] i64 on the GPU). The replayed
// ids are not checked here (validate_routing_replay checks them on the host before the upload):
// one outside [0, E) gives a NaN weight. E <= 1024.
void moe_route_replay(const Exec& ex, const Tensor& logits, const Tensor& replay_ids,
                      const RouterParams& params, const Tensor& expert_ids, const Tensor& weights,
                      const Tensor& counts);

// The CPU twin's offsets, row_of_slot and x_sorted exactly (x_sorted of another dtype than x: x's
// values converted, bf16 rounded to nearest even). Ids outside the owned range get row -1,
// invalid ones (outside [0, num_experts), which the CPU rejects) included; rows kept past
// x_sorted's end (R < rows kept, which the CPU rejects) are not copied. E_local <= 1024.
void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted);

// Bf16 weights run on the tensor cores when D and I are multiples of 8 and the tensors 16-byte
// aligned (x and h = silu(g) * u then round to bf16 as operands: ~1e-3 relative to the CPU
// twin; a bf16 x is read directly, an f32 one through a bf16 copy), except decode-sized calls
// (at most launch::kMoeGemvAutoRows rows, outside batch-invariant mode), which run a warp per
// weight row in f32 (the kGemv path: the tensor cores' tiles would leave most SMs idle there);
// f32 weights, and bf16 ones of other sizes, run f32 FMA (the CPU's arithmetic in another
// summation order). Batch-invariant mode's path depends on the dtypes, D, I and the device only. x
// and y are f32 or bf16 each (y rounded in the epilogue); gate_up, f32, is supported on every path.
// Stored FP8 weights (core/fp8_matrix.h, all three) use each weight as f32(q) * scale_inv of its
// 128 x 128 block: decode-sized calls (as kGemv above, up to launch::kMoeFp8GemvRowsPerExpert
// rows per expert on average, kernels/cuda/moe_fp8_launch.h) dequantize in registers and
// stay f32 (reading half of bf16's bytes); the rest dequantize the routed experts chunk by chunk
// into the scratch (at most launch::kMoeFp8DequantBytes of copies) and run the bf16 paths on
// them (each weight rounded once to bf16), or the f32 SIMT path (the f32 products kept) where
// the tensor cores cannot take the shape; from launch::kMoeFp8BlockRowsPerExpert rows per expert
// on average (outside batch-invariant mode, sm_90, D and I multiples of 16) x and h are quantized
// per row and 128 columns to e4m3 and both GEMMs run block-scaled FP8 wgmma on the stored weights
// (kWgmmaFp8, DeepSeek-V3's W8A8 recipe: ~5% relative error against the f32 twin on random data);
// kernels/cuda/moe_fp8.cu says more.
// Offsets must be non-decreasing within [0, R] (not checked: a bad one never makes a kernel reach
// outside the tensors). Uses scratch (h, and the bf16 copy of an f32 x) from ex.workspace when
// there is one, else a stream-ordered allocation (which costs time on every call: the engine always
// passes a workspace).
void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y, const Tensor& gate_up);

// The grouped SwiGLU on a chosen GEMM path (tests and benchmarks): "auto", "simt", "mma",
// "wgmma", "wgmma128", "gemv" or "wgmma_fp8" (launch::MoeGemmPath); aborts when the path cannot run
// these tensors on this device. Returns the name of the path that ran. `phases` (benchmarks) picks
// the launches that run (launch::MoeSwigluArgs::phases); anything but 7 leaves y incomplete.
// `fp8_chunk_bytes` (tests; 0: the default) bounds the dequantized copies of FP8 experts per chunk
// (launch::MoeSwigluArgs::fp8_chunk_bytes).
const char* moe_grouped_swiglu_on(const Exec& ex, const char* path, const Tensor& x,
                                  const Tensor& offsets, const Tensor& w_gate, const Tensor& w_up,
                                  const Tensor& w_down, const Tensor& y, const Tensor& gate_up,
                                  int phases = 7, size_t fp8_chunk_bytes = 0);

// y and out f32 or bf16 each; the sum runs in f32 in the CPU's order, a bf16 out rounded once. A
// row outside [-1, R) (which the CPU rejects) makes its token's output row NaN.
// addend: undefined or of out's shape and dtype (kernels/moe.h).
void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out, const Tensor& addend);

}  // namespace loom::cuda
