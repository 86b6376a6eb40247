// Raw launchers of the MoE forward kernels (kernels/cuda/moe.cu: router, permute, combine;
// kernels/cuda/moe_gemm.cu: the grouped SwiGLU). Like launch.h this header includes no Loom or
// Abseil header, so nvcc never parses Abseil; the Tensor-level entry points and their checks are
// in kernels/cuda/moe.{h,cc}. Index tensors (expert ids, offsets, row_of_slot) live on the device
// and are never copied back: no launcher synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::launch {

// moe_route: logits [T, E] f32, bias [E] f32 or null; ids [T, K] i32, weights [T, K] f32.
// E <= kMoeRouteMaxExperts. `grouped`: n_group > 1 and topk_group < n_group.
inline constexpr int kMoeRouteMaxExperts = 1024;
void moe_route(cudaStream_t stream, const float* logits, const float* bias, int64_t T, int E, int K,
               int n_group, int topk_group, bool sigmoid, bool renormalize, float routed_scaling,
               int32_t* ids, float* weights);

// moe_route_replay: logits [T, E] f32, replay [T, K] i32 (rows whose first id is negative
// untouched); ids and weights [T, K] as moe_route wrote them, rewritten for the replayed rows;
// counts [2] i64 (zeroed, then the replayed and differing slots). E <= kMoeRouteMaxExperts.
void moe_route_replay(cudaStream_t stream, const float* logits, const int32_t* replay, int64_t T,
                      int E, int K, bool sigmoid, bool renormalize, float routed_scaling,
                      int32_t* ids, float* weights, int64_t* counts);

// Activations (x, x_sorted, y, out) are f32 or bf16, each on its own (`*_bf16`); a bf16 one is
// widened on load and rounded to nearest even on store, the arithmetic stays f32. vec4: D % 4 == 0
// and every activation pointer 16-byte aligned (quads of 16 or 8 bytes per access).

// moe_permute: ids [slots = T * K] i32; offsets [ne + 1] and row_of_slot [slots] i32 (written);
// x [T, D] -> x_sorted [R, D] (rows >= R are never written). ne <= kMoePermuteMaxExperts.
// Up to kMoePermuteOneBlockSlots slots are ranked by one block; more by chunks, with
// moe_permute_scratch_bytes of device scratch (0 below the threshold: `scratch` may be null).
inline constexpr int kMoePermuteMaxExperts = 1024;
inline constexpr int64_t kMoePermuteOneBlockSlots = 8192;
size_t moe_permute_scratch_bytes(int64_t slots, int64_t ne);
void moe_permute(cudaStream_t stream, const void* x, bool x_bf16, const int32_t* ids, int64_t T,
                 int64_t K, int64_t D, int64_t first_expert, int64_t ne, int32_t* offsets,
                 int32_t* row_of_slot, void* x_sorted, bool xs_bf16, int64_t R, bool vec4,
                 void* scratch);

// moe_unpermute_combine: y [R, D]; rows, weights [T, K] (weights f32); out [T, D]; addend null
// or [T, D] of out's dtype, added to each rounded sum (kernels/moe.h).
void moe_unpermute_combine(cudaStream_t stream, const void* y, bool y_bf16, const int32_t* rows,
                           const float* weights, void* out, bool out_bf16, const void* addend,
                           int64_t T, int64_t K, int64_t D, int64_t R, bool vec4);

// The grouped SwiGLU's GEMM paths (kernels/cuda/moe_gemm.cu says how each works; with FP8
// weights, kernels/cuda/moe_fp8.cu: kGemv dequantizes in registers, kWgmmaFp8 multiplies the
// e4m3 weights as they are, every other path runs on the experts dequantized chunk by chunk into
// the scratch).
enum class MoeGemmPath : int {
  kAuto = 0,      // the fastest supported one for the shape, dtype and device
  kSimt = 1,      // f32 FMA (f32 or bf16 weights, any sizes)
  kMma = 2,       // bf16 mma.sync m16n8k16 (bf16 weights, D and I multiples of 8, 16-byte aligned)
  kWgmma = 3,     // bf16 wgmma (as kMma, on sm_90a devices): TMA, 128 x 256 tiles, persistent
  kWgmma128 = 4,  // bf16 wgmma with cp.async, 128 x 128 tiles, two blocks per SM
  kGemv = 5,      // warp per weight row, f32 arithmetic (as kMma, <= 4096 experts): decode shapes
  kWgmmaFp8 = 6,  // FP8 weights only, sm_90a: block-scaled FP8 wgmma on e4m3 x and h (D, I % 16)
};
// Up to this many rows (slots) kAuto takes kGemv outside batch-invariant mode: a decode step of
// up to 8 tokens at top-8. Past it the tensor-core tiles fill the GPU.
inline constexpr int64_t kMoeGemvAutoRows = 64;
const char* moe_gemm_path_name(MoeGemmPath path);

struct MoeSwigluArgs {
  const void* x = nullptr;           // [R, D] f32 or bf16 (x_bf16)
  const int32_t* offsets = nullptr;  // [E + 1], device
  const void* w_gate = nullptr;      // [E, I, D] f32 or bf16
  const void* w_up = nullptr;        // [E, I, D]
  const void* w_down = nullptr;      // [E, D, I]
  void* y = nullptr;                 // [R, D] f32 or bf16 (y_bf16)
  float* gate_up = nullptr;          // [2, R, I] f32 or null
  int64_t R = 0, D = 0, I = 0, E = 0;
  bool bf16 = false;  // weight dtype
  // Stored FP8 weights (core/fp8_matrix.h): w_* are e4m3 bytes and s_* their scale grids, f32
  // [E, ceil(rows / 128), ceil(cols / 128)] (w_gate's and w_up's rows I, cols D; w_down's D, I).
  bool fp8 = false;
  const float* s_gate = nullptr;
  const float* s_up = nullptr;
  const float* s_down = nullptr;
  // Tests: the bytes of dequantized expert copies per chunk on the FP8 paths that make copies
  // (0: launch::kMoeFp8DequantBytes, kernels/cuda/moe_fp8_launch.h).
  size_t fp8_chunk_bytes = 0;
  // Batch-invariant mode (Exec::batch_invariant): kAuto never picks a path by the row count.
  bool batch_invariant = false;
  bool x_bf16 = false, y_bf16 = false;
  // Benchmarks: which launches run (bit 0: f32 x to bf16 on the tensor-core paths, bit 1:
  // gate/up, bit 2: down); each reads what the earlier ones left in the scratch.
  int phases = 7;
};

// What a call runs, decided once from the arguments and the current device: the resolved path
// (kAuto resolves to the fastest supported one), whether it can run them, and the device scratch
// it needs (h = silu(g) * u, and on the tensor-core paths the bf16 copy of an f32 x).
struct MoeSwigluPlan {
  MoeGemmPath path = MoeGemmPath::kSimt;
  bool ok = false;
  size_t scratch_bytes = 0;
};
MoeSwigluPlan moe_swiglu_plan(const MoeSwigluArgs& a, MoeGemmPath path);
// Runs an ok plan; `scratch` holds plan.scratch_bytes bytes, 256-byte aligned.
void moe_grouped_swiglu(cudaStream_t stream, const MoeSwigluArgs& a, const MoeSwigluPlan& plan,
                        void* scratch);

}  // namespace loom::cuda::launch
