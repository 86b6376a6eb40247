// Contracts and device dispatch for kernels/attention_backward.h.
#include "kernels/attention_backward.h"

#include "kernels/cpu/attention_backward.h"
#include "kernels/cpu/varlen.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/backward.h"
#endif

namespace loom {
namespace {

struct Dims {
  int64_t T, Hq, Hkv, d, dv;
};

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (const Tensor* t : {&q, &k, &v}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3 && k.dim(0) == q.dim(0) &&
                 v.dim(0) == q.dim(0) && k.dim(2) == q.dim(2) && v.dim(1) == k.dim(1) &&
                 k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0,
             "%s: q %s k %s v %s (want q [T, Hq, d], k [T, Hkv, d], v [T, Hkv, dv], Hkv | Hq)", op,
             q.describe().c_str(), k.describe().c_str(), v.describe().c_str());
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), v.dim(2)};
}

}  // namespace

void causal_attention_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              float scale, const Tensor& out, const Tensor& lse) {
  static constexpr const char* kOp = "causal_attention_forward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, q, k, v, out, lse);
  const Dims d = check_qkv(kOp, q, k, v);
  LOOM_CHECK_F32(out);
  LOOM_CHECK_F32(lse);
  LOOM_CHECK(out.shape() == Shape({d.T, d.Hq, d.dv}) && lse.shape() == Shape({d.T, d.Hq}),
             "%s: out %s lse %s for q %s v %s", kOp, out.describe().c_str(), lse.describe().c_str(),
             q.describe().c_str(), v.describe().c_str());
  if (ex.device.is_cpu()) return cpu::causal_attention_forward(q, k, v, scale, out, lse);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_attention_forward(ex, q, k, v, scale, out, lse);
#else
  no_kernel_for(ex, kOp);
#endif
}

void causal_attention_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out, const Tensor& lse, const Tensor& d_out,
                               float scale, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  static constexpr const char* kOp = "causal_attention_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, q, k, v, out, lse, d_out);
  LOOM_ON_EXEC_DEVICE(ex, kOp, dq, dk, dv);
  const Dims d = check_qkv(kOp, q, k, v);
  for (const Tensor* t : {&out, &lse, &d_out, &dq, &dk, &dv}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(out.shape() == Shape({d.T, d.Hq, d.dv}) && d_out.shape() == out.shape() &&
                 lse.shape() == Shape({d.T, d.Hq}),
             "%s: out %s d_out %s lse %s for q %s v %s", kOp, out.describe().c_str(),
             d_out.describe().c_str(), lse.describe().c_str(), q.describe().c_str(),
             v.describe().c_str());
  LOOM_CHECK(dq.shape() == q.shape() && dk.shape() == k.shape() && dv.shape() == v.shape(),
             "%s: dq %s dk %s dv %s for q %s k %s v %s", kOp, dq.describe().c_str(),
             dk.describe().c_str(), dv.describe().c_str(), q.describe().c_str(),
             k.describe().c_str(), v.describe().c_str());
  if (ex.device.is_cpu())
    return cpu::causal_attention_backward(q, k, v, out, lse, d_out, scale, dq, dk, dv);
#ifdef LOOM_WITH_CUDA
  return cuda::causal_attention_backward(ex, q, k, v, out, lse, d_out, scale, dq, dk, dv);
#else
  no_kernel_for(ex, kOp);
#endif
}

void causal_attention_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                     float scale, const Tensor& out, const Tensor& lse) {
  static constexpr const char* kOp = "causal_attention_varlen_forward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, q, k, v, cu_seqlens, out, lse);
  const Dims d = check_qkv(kOp, q, k, v);
  LOOM_CHECK_F32(out);
  LOOM_CHECK_F32(lse);
  LOOM_CHECK(out.shape() == Shape({d.T, d.Hq, d.dv}) && lse.shape() == Shape({d.T, d.Hq}),
             "%s: out %s lse %s for q %s v %s", kOp, out.describe().c_str(), lse.describe().c_str(),
             q.describe().c_str(), v.describe().c_str());
  if (!ex.device.is_cpu()) {
#ifdef LOOM_WITH_CUDA
    return cuda::causal_attention_varlen_forward(ex, q, k, v, cu_seqlens, max_seqlen, scale, out,
                                                 lse);
#else
    no_kernel_for(ex, kOp);
#endif
  }
  const int64_t b = cpu::check_cu_seqlens(kOp, cu_seqlens, d.T);
  cpu::check_max_seqlen(kOp, cu_seqlens, max_seqlen);
  const int64_t* cu = cu_seqlens.data<int64_t>();
  for (int64_t s = 0; s < b; ++s) {
    const int64_t r0 = cu[s], r1 = cu[s + 1];
    if (r0 == r1) continue;
    cpu::causal_attention_forward(q.slice(0, r0, r1), k.slice(0, r0, r1), v.slice(0, r0, r1), scale,
                                  out.slice(0, r0, r1), lse.slice(0, r0, r1));
  }
}

void causal_attention_varlen_backward(const Exec& ex, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& cu_seqlens, int64_t max_seqlen,
                                      const Tensor& out, const Tensor& lse, const Tensor& d_out,
                                      float scale, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  static constexpr const char* kOp = "causal_attention_varlen_backward";
  LOOM_ON_EXEC_DEVICE(ex, kOp, q, k, v, cu_seqlens, out, lse, d_out);
  LOOM_ON_EXEC_DEVICE(ex, kOp, dq, dk, dv);
  const Dims d = check_qkv(kOp, q, k, v);
  for (const Tensor* t : {&out, &lse, &d_out, &dq, &dk, &dv}) LOOM_CHECK_F32(*t);
  LOOM_CHECK(out.shape() == Shape({d.T, d.Hq, d.dv}) && d_out.shape() == out.shape() &&
                 lse.shape() == Shape({d.T, d.Hq}) && dq.shape() == q.shape() &&
                 dk.shape() == k.shape() && dv.shape() == v.shape(),
             "%s: out %s d_out %s lse %s dq %s dk %s dv %s for q %s k %s v %s", kOp,
             out.describe().c_str(), d_out.describe().c_str(), lse.describe().c_str(),
             dq.describe().c_str(), dk.describe().c_str(), dv.describe().c_str(),
             q.describe().c_str(), k.describe().c_str(), v.describe().c_str());
  if (!ex.device.is_cpu()) {
#ifdef LOOM_WITH_CUDA
    return cuda::causal_attention_varlen_backward(ex, q, k, v, cu_seqlens, max_seqlen, out, lse,
                                                  d_out, scale, dq, dk, dv);
#else
    no_kernel_for(ex, kOp);
#endif
  }
  const int64_t b = cpu::check_cu_seqlens(kOp, cu_seqlens, d.T);
  cpu::check_max_seqlen(kOp, cu_seqlens, max_seqlen);
  const int64_t* cu = cu_seqlens.data<int64_t>();
  for (int64_t s = 0; s < b; ++s) {
    const int64_t r0 = cu[s], r1 = cu[s + 1];
    if (r0 == r1) continue;
    cpu::causal_attention_backward(q.slice(0, r0, r1), k.slice(0, r0, r1), v.slice(0, r0, r1),
                                   out.slice(0, r0, r1), lse.slice(0, r0, r1),
                                   d_out.slice(0, r0, r1), scale, dq.slice(0, r0, r1),
                                   dk.slice(0, r0, r1), dv.slice(0, r0, r1));
  }
}

}  // namespace loom
