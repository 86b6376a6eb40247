// Contracts and device dispatch for kernels/kda_backward.h.
#include "kernels/kda_backward.h"

#include <optional>

#include "kernels/cpu/kda_backward.h"
#include "kernels/cpu/kda_chunked_backward.h"
#include "kernels/cpu/varlen.h"
#include "kernels/elementwise.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#include "kernels/cuda/kda_chunked_backward.h"
#endif

namespace loom {
namespace {

void check_same_shape(const char* op, const Tensor& grad, const Tensor& of, const char* name) {
  LOOM_CHECK_F32(grad);
  LOOM_CHECK(grad.shape() == of.shape(), "%s: %s %s for %s", op, name, grad.describe().c_str(),
             of.describe().c_str());
}

// The contract shared by both forms of the delta-rule backward.
void check_delta_rule_backward(const char* op, const Exec& ex, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& g, const Tensor& beta,
                               const Tensor& initial_state, const Tensor& d_out,
                               const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                               const Tensor& d_initial_state) {
  LOOM_ON_EXEC_DEVICE(ex, op, q, k, v, g, beta, initial_state, d_out);
  LOOM_ON_EXEC_DEVICE(ex, op, dq, dk, dv, dg, dbeta);
  // kda_varlen_backward has no states (every sequence starts from zeros): initial_state undefined.
  for (const Tensor* t : {&q, &k, &v, &g, &beta, &d_out}) LOOM_CHECK_F32(*t);
  if (initial_state.defined() || d_final_state.defined() || d_initial_state.defined())
    LOOM_CHECK_F32(initial_state);
  LOOM_CHECK(q.ndim() == 3 && k.shape() == q.shape() && v.ndim() == 3 && v.dim(0) == q.dim(0),
             "%s: q %s k %s v %s", op, q.describe().c_str(), k.describe().c_str(),
             v.describe().c_str());
  const int64_t T = q.dim(0), Hk = q.dim(1), dkk = q.dim(2), Hv = v.dim(1), dvv = v.dim(2);
  LOOM_CHECK(Hk > 0 && Hv % Hk == 0, "%s: %lld value heads over %lld key heads", op,
             static_cast<long long>(Hv), static_cast<long long>(Hk));
  LOOM_CHECK(g.ndim() == 3 && g.dim(0) == T && g.dim(1) == Hv && (g.dim(2) == dkk || g.dim(2) == 1),
             "%s: g %s, expected [%lld, %lld, %lld or 1]", op, g.describe().c_str(),
             static_cast<long long>(T), static_cast<long long>(Hv), static_cast<long long>(dkk));
  LOOM_CHECK(beta.ndim() == 2 && beta.dim(0) == T && beta.dim(1) == Hv, "%s: beta %s", op,
             beta.describe().c_str());
  if (initial_state.defined())
    LOOM_CHECK(initial_state.shape() == Shape({Hv, dkk, dvv}), "%s: initial_state %s", op,
               initial_state.describe().c_str());
  check_same_shape(op, d_out, v, "d_out");
  check_same_shape(op, dq, q, "dq");
  check_same_shape(op, dk, k, "dk");
  check_same_shape(op, dv, v, "dv");
  check_same_shape(op, dg, g, "dg");
  check_same_shape(op, dbeta, beta, "dbeta");
  if (d_final_state.defined()) {
    LOOM_ON_EXEC_DEVICE(ex, op, d_final_state);
    check_same_shape(op, d_final_state, initial_state, "d_final_state");
  }
  if (d_initial_state.defined()) {
    LOOM_ON_EXEC_DEVICE(ex, op, d_initial_state);
    check_same_shape(op, d_initial_state, initial_state, "d_initial_state");
  }
}

}  // namespace

void kda_recurrent_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& g, const Tensor& beta, float scale,
                            const Tensor& initial_state, const Tensor& d_out,
                            const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                            const Tensor& d_initial_state) {
  static constexpr const char* kOp = "kda_recurrent_backward";
  LOOM_CHECK(initial_state.defined(), "%s: no initial_state (zeros for a new sequence)", kOp);
  check_delta_rule_backward(kOp, ex, q, k, v, g, beta, initial_state, d_out, d_final_state, dq, dk,
                            dv, dg, dbeta, d_initial_state);
  if (ex.device.is_cpu())
    return cpu::kda_recurrent_backward(q, k, v, g, beta, scale, initial_state, d_out, d_final_state,
                                       dq, dk, dv, dg, dbeta, d_initial_state);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_recurrent_backward(ex, q, k, v, g, beta, scale, initial_state, d_out,
                                      d_final_state, dq, dk, dv, dg, dbeta, d_initial_state);
#else
  no_kernel_for(ex, kOp);
#endif
}

size_t kda_chunked_backward_workspace_bytes(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv) {
  return static_cast<size_t>(cpu::kda_chunked_backward_scratch_floats(T, Hk, Hv, dk, dv)) *
         sizeof(float);
}

void kda_chunked_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, float scale,
                          const Tensor& initial_state, const Tensor& d_out,
                          const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state) {
  static constexpr const char* kOp = "kda_chunked_backward";
  LOOM_CHECK(initial_state.defined(), "%s: no initial_state (zeros for a new sequence)", kOp);
  check_delta_rule_backward(kOp, ex, q, k, v, g, beta, initial_state, d_out, d_final_state, dq, dk,
                            dv, dg, dbeta, d_initial_state);
  if (!ex.device.is_cpu()) {
#ifdef LOOM_WITH_CUDA
    return cuda::kda_chunked_backward(ex, q, k, v, g, beta, scale, initial_state, d_out,
                                      d_final_state, dq, dk, dv, dg, dbeta, d_initial_state);
#else
    no_kernel_for(ex, kOp);
#endif
  }
  std::optional<Workspace::Mark> mark;
  if (ex.workspace) mark.emplace(*ex.workspace);
  const Shape shape{
      cpu::kda_chunked_backward_scratch_floats(q.dim(0), q.dim(1), v.dim(1), q.dim(2), v.dim(2))};
  const Tensor scratch = ex.workspace ? ex.workspace->take(shape) : Tensor::empty(shape);
  cpu::kda_chunked_backward(q, k, v, g, beta, scale, initial_state, d_out, d_final_state, dq, dk,
                            dv, dg, dbeta, d_initial_state, scratch);
}

void kda_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& cu_seqlens,
                         int64_t max_seqlen, const Tensor& d_out, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv, const Tensor& dg,
                         const Tensor& dbeta) {
  static constexpr const char* kOp = "kda_varlen_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, cu_seqlens);
  LOOM_CHECK(max_seqlen >= 0, "%s: max_seqlen %lld", kOp, static_cast<long long>(max_seqlen));
  if (!ex.device.is_cpu() && !ex.batch_invariant) {
    check_delta_rule_backward(kOp, ex, q, k, v, g, beta, Tensor(), d_out, Tensor(), dq, dk, dv, dg,
                              dbeta, Tensor());
#ifdef LOOM_WITH_CUDA
    return cuda::kda_chunked_varlen_backward(ex, q, k, v, g, beta, scale, cu_seqlens, max_seqlen,
                                             d_out, dq, dk, dv, dg, dbeta);
#else
    no_kernel_for(ex, kOp);
#endif
  }
  // One call per sequence, from a zero state, in the form its forward took.
  const Tensor cu_host = cu_seqlens.to(Device::kCpu);
  const int64_t b = cpu::check_cu_seqlens(kOp, cu_host, q.dim(0));
  cpu::check_max_seqlen(kOp, cu_host, max_seqlen);
  const int64_t* cu = cu_host.data<int64_t>();
  Tensor zero_state = Tensor::empty({v.dim(1), q.dim(2), v.dim(2)}, DType::kF32, ex.device);
  zero_fill(ex, zero_state);
  for (int64_t s = 0; s < b; ++s) {
    const int64_t r0 = cu[s], r1 = cu[s + 1];
    if (r0 == r1) continue;
    const auto form =
        kda_backward_takes_recurrence(ex, r1 - r0) ? kda_recurrent_backward : kda_chunked_backward;
    form(ex, q.slice(0, r0, r1), k.slice(0, r0, r1), v.slice(0, r0, r1), g.slice(0, r0, r1),
         beta.slice(0, r0, r1), scale, zero_state, d_out.slice(0, r0, r1), Tensor(),
         dq.slice(0, r0, r1), dk.slice(0, r0, r1), dv.slice(0, r0, r1), dg.slice(0, r0, r1),
         dbeta.slice(0, r0, r1), Tensor());
  }
}

void kda_gate_backward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                       float lower_bound, const Tensor& d_g, const Tensor& d_f,
                       const Tensor& d_A_log, const Tensor& d_dt_bias) {
  static constexpr const char* kOp = "kda_gate_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, f, A_log, d_g, d_f, d_A_log);
  LOOM_CHECK_F32(f);
  LOOM_CHECK_F32(A_log);
  LOOM_CHECK(f.ndim() == 2 && A_log.numel() > 0 && f.dim(1) % A_log.numel() == 0,
             "%s: f %s with A_log %s", kOp, f.describe().c_str(), A_log.describe().c_str());
  LOOM_CHECK(lower_bound <= 0.0f, "%s: lower_bound %g > 0", kOp, lower_bound);
  check_same_shape(kOp, d_g, f, "d_g");
  check_same_shape(kOp, d_f, f, "d_f");
  check_same_shape(kOp, d_A_log, A_log, "d_A_log");
  LOOM_CHECK(dt_bias.defined() == d_dt_bias.defined(), "%s: dt_bias %s but d_dt_bias %s", kOp,
             dt_bias.defined() ? "given" : "absent", d_dt_bias.defined() ? "given" : "absent");
  if (dt_bias.defined()) {
    LOOM_ON_EXEC_DEVICE(ex, kOp, dt_bias, d_dt_bias);
    LOOM_CHECK_F32(dt_bias);
    LOOM_CHECK(dt_bias.numel() == f.dim(1), "%s: dt_bias %s for f %s", kOp,
               dt_bias.describe().c_str(), f.describe().c_str());
    check_same_shape(kOp, d_dt_bias, dt_bias, "d_dt_bias");
  }
  if (ex.device.is_cpu())
    return cpu::kda_gate_backward(f, A_log, dt_bias, lower_bound, d_g, d_f, d_A_log, d_dt_bias);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_gate_backward(ex, f, A_log, dt_bias, lower_bound, d_g, d_f, d_A_log, d_dt_bias);
#else
  no_kernel_for(ex, kOp);
#endif
}

}  // namespace loom
