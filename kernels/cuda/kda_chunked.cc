// Host side of the varlen KDA kernels (kernels/cuda/kda_chunked.cu): checks as in
// kernels/cpu/kda.cc, the choice of form, and the workspace.
#include "kernels/cuda/kda_chunked.h"

#include <cstdint>
#include <limits>

#include "core/workspace.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_checks.h"
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/cuda/kda_decode.h"
#include "kernels/kda.h"

namespace loom::cuda {
namespace {

// Checks every argument (states as [num_slots, Hv, dk, dv]) and fills the launch arguments but
// for the device pointers of the slots and cu_seqlens.
launch::KdaVarlenArgs check_args(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& g, const Tensor& beta, float scale,
                                 const Tensor& states, const Tensor& out) {
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, k);
  LOOM_CHECK_CUDA_ARG(fn, v);
  LOOM_CHECK_CUDA_ARG(fn, g);
  LOOM_CHECK_CUDA_ARG(fn, beta);
  LOOM_CHECK_CUDA_ARG(fn, states);
  LOOM_CHECK_CUDA_ARG(fn, out);
  check_kda_activations(fn, q, k, v, beta, out);
  const DType act = q.dtype();
  LOOM_CHECK_F32(g);
  LOOM_CHECK_F32(states);
  LOOM_CHECK(q.ndim() == 3 && v.ndim() == 3 && states.ndim() == 4 && states.dim(0) > 0,
             "%s: q %s v %s states %s", fn, q.describe().c_str(), v.describe().c_str(),
             states.describe().c_str());
  const int64_t N = q.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  LOOM_CHECK(Hk > 0 && Hv % Hk == 0, "%s: Hv %lld is not a multiple of Hk %lld", fn,
             static_cast<long long>(Hv), static_cast<long long>(Hk));
  LOOM_CHECK_SHAPE(k, N, Hk, dk);
  LOOM_CHECK_SHAPE(v, N, Hv, dv);
  LOOM_CHECK(g.ndim() == 3 && g.dim(0) == N && g.dim(1) == Hv && (g.dim(2) == dk || g.dim(2) == 1),
             "%s: g %s, expected [%lld, %lld, %lld or 1]", fn, g.describe().c_str(),
             static_cast<long long>(N), static_cast<long long>(Hv), static_cast<long long>(dk));
  LOOM_CHECK_SHAPE(beta, N, Hv);
  LOOM_CHECK_SHAPE(states, states.dim(0), Hv, dk, dv);
  LOOM_CHECK_SHAPE(out, N, Hv, dv);
  LOOM_CHECK(dk <= 256 && Hv <= 65535 && dv <= (int64_t{1} << 24),
             "%s: dk %lld > 256, Hv %lld or dv %lld is not supported by the CUDA kernels", fn,
             static_cast<long long>(dk), static_cast<long long>(Hv), static_cast<long long>(dv));
  launch::KdaVarlenArgs a;
  a.q = q.raw();
  a.k = k.raw();
  a.v = v.raw();
  a.g = g.data<float>();
  a.beta = beta.raw();
  a.out = out.raw();
  a.pool = states.data<float>();
  a.scale = scale;
  a.N = N;
  a.num_slots = states.dim(0);
  a.Hk = static_cast<int>(Hk);
  a.Hv = static_cast<int>(Hv);
  a.dk = static_cast<int>(dk);
  a.dv = static_cast<int>(dv);
  a.scalar_g = g.dim(2) == 1 && dk != 1;
  a.bf16 = act == DType::kBF16;
  a.beta_bf16 = beta.dtype() == DType::kBF16;
  return a;
}

// The chunked launches with their workspace (ex.workspace if any, else a stream-ordered
// allocation freed after the launches, in stream order).
void run_chunked(const Exec& ex, const launch::KdaVarlenArgs& a, int64_t rmax, int bv) {
  const size_t bytes = launch::kda_chunked_workspace_bytes(a);
  const cudaStream_t stream = stream_of(ex);
  if (ex.workspace != nullptr) {
    const Workspace::Mark mark(*ex.workspace);
    const Tensor w = ex.workspace->take({static_cast<int64_t>(bytes)}, DType::kU8);
    launch::kda_chunked_varlen(stream, a, rmax, w.raw(), bv);
    return;
  }
  const Scratch w(bytes, stream);
  launch::kda_chunked_varlen(stream, a, rmax, w.get(), bv);
}

void varlen(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
            const Tensor& beta, float scale, const Tensor& states, const Tensor& state_slots,
            const Tensor& cu_seqlens, const Tensor& out, int64_t max_seqlen, int bv) {
  const char* fn = "kda_varlen_forward";
  launch::KdaVarlenArgs a = check_args(fn, q, k, v, g, beta, scale, states, out);
  LOOM_CHECK_CUDA_ARG(fn, state_slots);
  LOOM_CHECK_CUDA_ARG(fn, cu_seqlens);
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
                 cu_seqlens.dim(0) >= 1 && cu_seqlens.is_contiguous(),
             "%s: cu_seqlens %s, expected contiguous i64 [B + 1]", fn,
             cu_seqlens.describe().c_str());
  const int64_t B = cu_seqlens.dim(0) - 1;
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.is_contiguous(),
             "%s: state_slots %s, expected contiguous i32", fn, state_slots.describe().c_str());
  LOOM_CHECK_SHAPE(state_slots, B);
  LOOM_CHECK(max_seqlen >= 0, "%s: max_seqlen %lld < 0", fn, static_cast<long long>(max_seqlen));
  a.B = B;
  a.slots = state_slots.data<int32_t>();
  a.cu = cu_seqlens.data<int64_t>();
  if (B == 0 || a.N == 0 || a.dv == 0) return;
  // A decode step: one row per sequence (max_seqlen 1 and N == B leave no other split).
  if (!ex.batch_invariant && max_seqlen == 1 && a.N == B) {
    kda_decode_batched(ex, q, k, v, g, beta, scale, states, state_slots, out);
    return;
  }
  constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
  int64_t rmax = ex.batch_invariant ? kAll : kKdaRecurrentMaxTokens;
  if (!launch::kda_chunked_supported(a)) rmax = kAll;
  launch::kda_recurrent_varlen(stream_of(ex), a, rmax);
  const bool any_chunked = rmax != kAll && (max_seqlen == 0 || max_seqlen > rmax);
  if (any_chunked) run_chunked(ex, a, rmax, bv);
}

}  // namespace

void kda_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, const Tensor& out,
                        int64_t max_seqlen) {
  varlen(ex, q, k, v, g, beta, scale, states, state_slots, cu_seqlens, out, max_seqlen, 0);
}

void kda_varlen_forward_tuned(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& g, const Tensor& beta, float scale,
                              const Tensor& states, const Tensor& state_slots,
                              const Tensor& cu_seqlens, const Tensor& out, int64_t max_seqlen,
                              int bv) {
  varlen(ex, q, k, v, g, beta, scale, states, state_slots, cu_seqlens, out, max_seqlen, bv);
}

void kda_chunked_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                         const Tensor& out) {
  const char* fn = "kda_chunked_forward";
  LOOM_CHECK_CUDA_ARG(fn, state);
  LOOM_CHECK(state.ndim() == 3, "%s: state %s, expected [Hv, dk, dv]", fn,
             state.describe().c_str());
  const Tensor pool = state.reshape({1, state.dim(0), state.dim(1), state.dim(2)});
  launch::KdaVarlenArgs a = check_args(fn, q, k, v, g, beta, scale, pool, out);
  if (a.N == 0 || a.dv == 0) return;
  // One sequence of N rows in slot 0: its cu_seqlens and slot uploaded for the call.
  const cudaStream_t stream = stream_of(ex);
  struct {
    int64_t cu[2];
    int32_t slot[2];
  } host{{0, a.N}, {0, 0}};
  Scratch meta(sizeof(host), stream);
  meta.upload(&host, sizeof(host));
  a.B = 1;
  a.cu = static_cast<const int64_t*>(meta.get());
  a.slots = reinterpret_cast<const int32_t*>(static_cast<const char*>(meta.get()) + 16);
  if (launch::kda_chunked_supported(a)) {
    run_chunked(ex, a, /*rmax=*/0, 0);
  } else {
    launch::kda_recurrent_varlen(stream, a, std::numeric_limits<int64_t>::max());
  }
}

}  // namespace loom::cuda
