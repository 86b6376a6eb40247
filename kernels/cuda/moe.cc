// Host side of the CUDA MoE forward ops: the CPU twins' checks that need no values from the device
// (shapes, dtypes, devices, contiguity), then the launches (kernels/cuda/moe_launch.h).
#include "kernels/cuda/moe.h"

#include <climits>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/fp8_matrix.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe_launch.h"

namespace loom::cuda {
namespace {

// The one argument check of every op here: each tensor on the GPU, contiguous, of its dtype
// (std::nullopt: any; the caller checks it). An undefined tensor marked optional is skipped.
struct Arg {
  const char* name;
  const Tensor& t;
  std::optional<DType> dtype;
  bool optional = false;
};
void check_args(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (a.optional && !a.t.defined()) continue;
    check_on_device(op, a.name, a.t);
    LOOM_CHECK(a.t.is_contiguous() && (!a.dtype || a.t.dtype() == *a.dtype),
               "%s: %s %s, expected contiguous %s", op, a.name, a.t.describe().c_str(),
               a.dtype ? std::string(dtype_name(*a.dtype)).c_str() : "(any dtype)");
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Activations (x, x_sorted, y, out) are f32 or bf16, each on its own; true for bf16.
bool activation_bf16(const char* op, const char* name, const Tensor& t) {
  LOOM_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16,
             "%s: %s %s, expected f32 or bf16", op, name, t.describe().c_str());
  return t.dtype() == DType::kBF16;
}

// Runs fn(scratch) with `bytes` of device scratch (null for 0): from ex.workspace when there is
// one (released when fn returns; later kernels on the stream may reuse it), else a stream-ordered
// allocation.
template <typename Fn>
void with_scratch(const Exec& ex, const char* op, size_t bytes, const Fn& fn) {
  if (bytes == 0) return fn(nullptr);
  if (ex.workspace) {
    const Workspace::Mark mark(*ex.workspace);
    const Tensor scratch = ex.workspace->take({static_cast<int64_t>(bytes)}, DType::kU8);
    LOOM_CHECK(scratch.device() == ex.device && aligned16(scratch.raw()),
               "%s: the workspace is on %s", op, device_name(scratch.device()).c_str());
    return fn(scratch.raw());
  }
  const Scratch scratch(bytes, stream_of(ex));
  fn(scratch.get());
}

launch::MoeGemmPath parse_path(const char* name) {
  using launch::MoeGemmPath;
  for (MoeGemmPath p :
       {MoeGemmPath::kAuto, MoeGemmPath::kSimt, MoeGemmPath::kMma, MoeGemmPath::kWgmma,
        MoeGemmPath::kWgmma128, MoeGemmPath::kGemv, MoeGemmPath::kWgmmaFp8}) {
    if (std::strcmp(name, launch::moe_gemm_path_name(p)) == 0) return p;
  }
  LOOM_CHECK(
      false,
      "moe_grouped_swiglu: unknown GEMM path \"%s\" (auto, simt, mma, wgmma, wgmma128, gemv, "
      "wgmma_fp8)",
      name);
  return MoeGemmPath::kAuto;
}

const char* grouped_swiglu(const Exec& ex, launch::MoeGemmPath path, const Tensor& x,
                           const Tensor& offsets, const Tensor& w_gate, const Tensor& w_up,
                           const Tensor& w_down, const Tensor& y, const Tensor& gate_up, int phases,
                           size_t fp8_chunk_bytes) {
  static constexpr const char* kOp = "moe_grouped_swiglu";
  const DType wt = w_gate.dtype();
  check_args(kOp, {{"x", x, std::nullopt},
                   {"offsets", offsets, DType::kI32},
                   {"w_gate", w_gate, std::nullopt},
                   {"w_up", w_up, wt},
                   {"w_down", w_down, wt},
                   {"y", y, std::nullopt},
                   {"gate_up", gate_up, DType::kF32, true}});
  LOOM_CHECK(wt == DType::kF32 || wt == DType::kBF16 || wt == DType::kF8E4M3,
             "%s: expert weights must be f32, bf16 or stored fp8: w_gate %s", kOp,
             w_gate.describe().c_str());
  LOOM_CHECK(x.ndim() == 2 && w_gate.ndim() == 3, "%s: x %s w_gate %s", kOp, x.describe().c_str(),
             w_gate.describe().c_str());
  const int64_t r = x.dim(0), d = x.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  LOOM_CHECK_SHAPE(offsets, ne + 1);
  LOOM_CHECK_SHAPE(w_gate, ne, inter, d);
  LOOM_CHECK_SHAPE(w_up, ne, inter, d);
  LOOM_CHECK_SHAPE(w_down, ne, d, inter);
  LOOM_CHECK_SHAPE(y, r, d);
  if (gate_up.defined()) LOOM_CHECK_SHAPE(gate_up, 2, r, inter);
  LOOM_CHECK(r <= INT_MAX && d <= INT_MAX && inter <= INT_MAX && ne <= INT_MAX,
             "%s: sizes beyond the kernels' 32-bit indices: x %s w_gate %s", kOp,
             x.describe().c_str(), w_gate.describe().c_str());
  LOOM_CHECK(y.raw() != x.raw() || r * d == 0, "%s: y aliases x", kOp);

  launch::MoeSwigluArgs a;
  a.x_bf16 = activation_bf16(kOp, "x", x);
  a.y_bf16 = activation_bf16(kOp, "y", y);
  a.x = x.raw();
  a.offsets = offsets.data<int32_t>();
  a.w_gate = w_gate.raw();
  a.w_up = w_up.raw();
  a.w_down = w_down.raw();
  a.y = y.raw();
  a.gate_up = gate_up.defined() ? gate_up.data<float>() : nullptr;
  a.R = r;
  a.D = d;
  a.I = inter;
  a.E = ne;
  a.bf16 = wt == DType::kBF16;
  a.fp8 = wt == DType::kF8E4M3;
  if (a.fp8) {
    a.s_gate = fp8_matrix_scales(w_gate).data<float>();
    a.s_up = fp8_matrix_scales(w_up).data<float>();
    a.s_down = fp8_matrix_scales(w_down).data<float>();
  }
  a.batch_invariant = ex.batch_invariant;
  a.phases = phases;
  a.fp8_chunk_bytes = fp8_chunk_bytes;
  const launch::MoeSwigluPlan plan = launch::moe_swiglu_plan(a, path);
  LOOM_CHECK(plan.ok,
             "%s: the %s GEMM path cannot run these tensors on this device (it needs bf16 or "
             "fp8 weights, D and I multiples of 8, 16-byte aligned tensors%s): x %s w_gate %s",
             kOp, launch::moe_gemm_path_name(path),
             path == launch::MoeGemmPath::kWgmmaFp8 ? "; wgmma_fp8: fp8 weights, D and I "
                                                      "multiples of 16 and an sm_90 GPU"
             : path == launch::MoeGemmPath::kWgmma || path == launch::MoeGemmPath::kWgmma128
                 ? " and an sm_90 GPU"
                 : "",
             x.describe().c_str(), w_gate.describe().c_str());
  if (r > 0 && ne > 0) {
    with_scratch(ex, kOp, plan.scratch_bytes, [&](void* scratch) {
      launch::moe_grouped_swiglu(stream_of(ex), a, plan, scratch);
    });
  }
  return launch::moe_gemm_path_name(plan.path);
}

}  // namespace

void moe_route(const Exec& ex, const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights) {
  static constexpr const char* kOp = "moe_route";
  check_args(kOp, {{"logits", logits, DType::kF32},
                   {"bias", bias, DType::kF32, true},
                   {"expert_ids", expert_ids, DType::kI32},
                   {"weights", weights, DType::kF32}});
  LOOM_CHECK(logits.ndim() == 2, "%s: logits %s", kOp, logits.describe().c_str());
  const int64_t t = logits.dim(0);
  const int64_t e = logits.dim(1);
  const int k = params.top_k, ng = params.n_group, kg = params.topk_group;
  LOOM_CHECK(e >= 1 && e <= launch::kMoeRouteMaxExperts,
             "%s: %d experts (the CUDA router takes 1 to %d)", kOp, e, launch::kMoeRouteMaxExperts);
  LOOM_CHECK(ng >= 1 && e % ng == 0 && kg >= 1 && kg <= ng, "%s: E=%d n_group=%d topk_group=%d",
             kOp, e, ng, kg);
  const int64_t gsize = e / ng;
  LOOM_CHECK(ng == 1 || gsize >= 2, "%s: groups of %d experts (top-2 group score)", kOp, gsize);
  LOOM_CHECK(k >= 1 && k <= kg * gsize, "%s: top_k=%d with %d kept experts", kOp, k, kg * gsize);
  if (bias.defined()) LOOM_CHECK_SHAPE(bias, e);
  LOOM_CHECK_SHAPE(expert_ids, t, k);
  LOOM_CHECK_SHAPE(weights, t, k);
  launch::moe_route(stream_of(ex), logits.data<float>(),
                    bias.defined() ? bias.data<float>() : nullptr, t, static_cast<int>(e), k, ng,
                    kg, params.score == RouterScore::kSigmoid, params.renormalize,
                    params.routed_scaling, expert_ids.data<int32_t>(), weights.data<float>());
}

void moe_route_replay(const Exec& ex, const Tensor& logits, const Tensor& replay_ids,
                      const RouterParams& params, const Tensor& expert_ids, const Tensor& weights,
                      const Tensor& counts) {
  static constexpr const char* kOp = "moe_route_replay";
  check_args(kOp, {{"logits", logits, DType::kF32},
                   {"replay_ids", replay_ids, DType::kI32},
                   {"expert_ids", expert_ids, DType::kI32},
                   {"weights", weights, DType::kF32},
                   {"counts", counts, DType::kI64}});
  const int64_t t = logits.dim(0), e = logits.dim(1);
  LOOM_CHECK(e >= 1 && e <= launch::kMoeRouteMaxExperts,
             "%s: %d experts (the CUDA router takes 1 to %d)", kOp, e, launch::kMoeRouteMaxExperts);
  launch::moe_route_replay(stream_of(ex), logits.data<float>(), replay_ids.data<int32_t>(), t,
                           static_cast<int>(e), params.top_k, params.score == RouterScore::kSigmoid,
                           params.renormalize, params.routed_scaling, expert_ids.data<int32_t>(),
                           weights.data<float>(), counts.data<int64_t>());
}

void moe_permute(const Exec& ex, const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted) {
  static constexpr const char* kOp = "moe_permute";
  check_args(kOp, {{"x", x, std::nullopt},
                   {"expert_ids", expert_ids, DType::kI32},
                   {"offsets", offsets, DType::kI32},
                   {"row_of_slot", row_of_slot, DType::kI32},
                   {"x_sorted", x_sorted, std::nullopt}});
  const bool x_bf16 = activation_bf16(kOp, "x", x);
  const bool xs_bf16 = activation_bf16(kOp, "x_sorted", x_sorted);
  LOOM_CHECK(x.ndim() == 2 && expert_ids.ndim() == 2 && offsets.ndim() == 1 && x_sorted.ndim() == 2,
             "%s: x %s expert_ids %s offsets %s x_sorted %s", kOp, x.describe().c_str(),
             expert_ids.describe().c_str(), offsets.describe().c_str(),
             x_sorted.describe().c_str());
  const int64_t t = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  const int64_t ne = offsets.dim(0) - 1;
  LOOM_CHECK_SHAPE(expert_ids, t, k);
  LOOM_CHECK_SHAPE(row_of_slot, t, k);
  LOOM_CHECK(ne >= 0 && first_expert >= 0 && first_expert + ne <= num_experts,
             "%s: experts [%d, %d) of %d", kOp, first_expert, first_expert + ne, num_experts);
  LOOM_CHECK(ne <= launch::kMoePermuteMaxExperts, "%s: %d owned experts (the CUDA kernel takes %d)",
             kOp, ne, launch::kMoePermuteMaxExperts);
  LOOM_CHECK(x_sorted.dim(1) == d, "%s: x %s x_sorted %s", kOp, x.describe().c_str(),
             x_sorted.describe().c_str());
  LOOM_CHECK(t * k <= INT_MAX, "%s: %d slots overflow i32", kOp, t * k);
  const bool vec4 = d % 4 == 0 && aligned16(x.raw()) && aligned16(x_sorted.raw());
  with_scratch(ex, kOp, launch::moe_permute_scratch_bytes(t * k, ne), [&](void* scratch) {
    launch::moe_permute(stream_of(ex), x.raw(), x_bf16, expert_ids.data<int32_t>(), t, k, d,
                        first_expert, ne, offsets.data<int32_t>(), row_of_slot.data<int32_t>(),
                        x_sorted.raw(), xs_bf16, x_sorted.dim(0), vec4, scratch);
  });
}

void moe_grouped_swiglu(const Exec& ex, const Tensor& x, const Tensor& offsets,
                        const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                        const Tensor& y, const Tensor& gate_up) {
  grouped_swiglu(ex, launch::MoeGemmPath::kAuto, x, offsets, w_gate, w_up, w_down, y, gate_up, 7,
                 0);
}

const char* moe_grouped_swiglu_on(const Exec& ex, const char* path, const Tensor& x,
                                  const Tensor& offsets, const Tensor& w_gate, const Tensor& w_up,
                                  const Tensor& w_down, const Tensor& y, const Tensor& gate_up,
                                  int phases, size_t fp8_chunk_bytes) {
  return grouped_swiglu(ex, parse_path(path), x, offsets, w_gate, w_up, w_down, y, gate_up, phases,
                        fp8_chunk_bytes);
}

void moe_unpermute_combine(const Exec& ex, const Tensor& y, const Tensor& row_of_slot,
                           const Tensor& weights, const Tensor& out, const Tensor& addend) {
  static constexpr const char* kOp = "moe_unpermute_combine";
  check_args(kOp, {{"y", y, std::nullopt},
                   {"row_of_slot", row_of_slot, DType::kI32},
                   {"weights", weights, DType::kF32},
                   {"out", out, std::nullopt}});
  const bool y_bf16 = activation_bf16(kOp, "y", y);
  const bool out_bf16 = activation_bf16(kOp, "out", out);
  LOOM_CHECK(y.ndim() == 2 && row_of_slot.ndim() == 2 && out.ndim() == 2,
             "%s: y %s row_of_slot %s out %s", kOp, y.describe().c_str(),
             row_of_slot.describe().c_str(), out.describe().c_str());
  const int64_t t = out.dim(0), d = out.dim(1), k = row_of_slot.dim(1), r = y.dim(0);
  LOOM_CHECK_SHAPE(row_of_slot, t, k);
  LOOM_CHECK_SHAPE(weights, t, k);
  LOOM_CHECK(y.dim(1) == d, "%s: y %s out %s", kOp, y.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(out.raw() != y.raw() || t * d == 0, "%s: out aliases y", kOp);
  check_args(kOp, {{"addend", addend, out.dtype(), /*optional=*/true}});
  const bool vec4 = d % 4 == 0 && aligned16(y.raw()) && aligned16(out.raw()) &&
                    (!addend.defined() || aligned16(addend.raw()));
  launch::moe_unpermute_combine(stream_of(ex), y.raw(), y_bf16, row_of_slot.data<int32_t>(),
                                weights.data<float>(), out.raw(), out_bf16,
                                addend.defined() ? addend.raw() : nullptr, t, k, d, r, vec4);
}

}  // namespace loom::cuda
