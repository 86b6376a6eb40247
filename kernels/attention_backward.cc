// Contracts and device dispatch for kernels/attention_backward.h.
#include "kernels/attention_backward.h"

#include <vector>

#include "kernels/cpu/attention_backward.h"
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

// The host's view of a packed batch's offsets, checked against the rows and max_seqlen.
std::vector<int64_t> checked_offsets(const char* op, const Tensor& cu_seqlens, int64_t rows,
                                     int64_t max_seqlen) {
  LOOM_CHECK(cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 && cu_seqlens.dim(0) >= 1,
             "%s: cu_seqlens %s (want i64 [B + 1])", op, cu_seqlens.describe().c_str());
  const Tensor host = cu_seqlens.to(Device::kCpu);
  std::vector<int64_t> cu(host.data<int64_t>(), host.data<int64_t>() + host.numel());
  LOOM_CHECK(cu.front() == 0 && cu.back() == rows, "%s: cu_seqlens runs %lld..%lld over %lld rows",
             op, static_cast<long long>(cu.front()), static_cast<long long>(cu.back()),
             static_cast<long long>(rows));
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    LOOM_CHECK(cu[s] <= cu[s + 1] && cu[s + 1] - cu[s] <= max_seqlen,
               "%s: sequence %zu is rows %lld..%lld (max_seqlen %lld)", op, s,
               static_cast<long long>(cu[s]), static_cast<long long>(cu[s + 1]),
               static_cast<long long>(max_seqlen));
  return cu;
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
  const std::vector<int64_t> cu = checked_offsets(kOp, cu_seqlens, d.T, max_seqlen);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], e = cu[s + 1];
    if (b == e) continue;
    cpu::causal_attention_forward(q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e), scale,
                                  out.slice(0, b, e), lse.slice(0, b, e));
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
  const std::vector<int64_t> cu = checked_offsets(kOp, cu_seqlens, d.T, max_seqlen);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], e = cu[s + 1];
    if (b == e) continue;
    cpu::causal_attention_backward(q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e),
                                   out.slice(0, b, e), lse.slice(0, b, e), d_out.slice(0, b, e),
                                   scale, dq.slice(0, b, e), dk.slice(0, b, e), dv.slice(0, b, e));
  }
}

}  // namespace loom
