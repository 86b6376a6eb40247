// Host side of the chunked delta-rule backward on CUDA (kernels/cuda/kda_chunked_backward.h):
// device checks, the scratch, the launch. kernels/kda_backward.cc has checked shapes and dtypes.
#include "kernels/cuda/kda_chunked_backward.h"

#include <initializer_list>

#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_chunked_backward_launch.h"

namespace loom::cuda {

void kda_chunked_backward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, float scale,
                          const Tensor& initial_state, const Tensor& d_out,
                          const Tensor& d_final_state, const Tensor& dq, const Tensor& dk,
                          const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state) {
  static constexpr const char* kOp = "kda_chunked_backward";
  for (const Tensor* t : {&q, &k, &v, &g, &beta, &initial_state, &d_out, &dq, &dk, &dv, &dg, &dbeta,
                          &d_final_state, &d_initial_state}) {
    if (!t->defined()) continue;  // only the two optional states may be
    check_on_device(kOp, "tensor", *t);
    LOOM_CHECK(t->is_contiguous(), "%s (CUDA): %s is not contiguous", kOp, t->describe().c_str());
  }
  launch::KdaBackwardArgs a{};
  a.T = q.dim(0);
  a.Hk = q.dim(1);
  a.dk = q.dim(2);
  a.Hv = v.dim(1);
  a.dv = v.dim(2);
  LOOM_CHECK(a.Hv <= 65535, "%s (CUDA): %lld value heads; one block each, at most 65535", kOp,
             static_cast<long long>(a.Hv));
  a.scalar_g = g.dim(2) == 1;
  a.q = q.data<float>();
  a.k = k.data<float>();
  a.v = v.data<float>();
  a.g = g.data<float>();
  a.beta = beta.data<float>();
  a.s0 = initial_state.data<float>();
  a.d_out = d_out.data<float>();
  a.d_final = d_final_state.defined() ? d_final_state.data<float>() : nullptr;
  a.scale = scale;
  a.dq = dq.data<float>();
  a.dk_out = dk.data<float>();
  a.dv_out = dv.data<float>();
  a.dg = dg.data<float>();
  a.dbeta = dbeta.data<float>();
  a.d_s0 = d_initial_state.defined() ? d_initial_state.data<float>() : nullptr;
  cudaStream_t s = stream_of(ex);
  Scratch scratch(static_cast<size_t>(
                      launch::kda_chunked_backward_scratch_floats(a.T, a.Hk, a.Hv, a.dk, a.dv)) *
                      sizeof(float),
                  s);
  a.scratch = static_cast<float*>(scratch.get());
  launch::kda_chunked_backward(s, a);
}

}  // namespace loom::cuda
