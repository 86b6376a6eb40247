// Host side of the CUDA optimizer kernels (kernels/cuda/optim.h): the CPU's scalar setup
// (kernels/cpu/optim.cc), then the launches.
#include "kernels/cuda/optim.h"

#include <cmath>

#include "kernels/cuda/device.h"

namespace loom::cuda {

void adamw_update(const Exec& ex, const AdamWStep& s, const Tensor& param, const Tensor& grad,
                  const Tensor& m, const Tensor& v) {
  for (const Tensor* t : {&param, &grad, &m, &v}) check_on_device("adamw_update", "tensor", *t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  launch::adamw(stream_of(ex), param.data<float>(), grad.data<float>(), m.data<float>(),
                v.data<float>(), param.numel(), s.grad_scale, s.beta1, s.beta2, s.eps,
                static_cast<float>(s.lr / bc1), static_cast<float>(std::sqrt(bc2)),
                1.0f - s.lr * s.weight_decay);
}

void sum_of_squares(const Exec& ex, const Tensor& x, const Tensor& out) {
  check_on_device("sum_of_squares", "x", x);
  check_on_device("sum_of_squares", "out", out);
  const int64_t n = x.numel();
  const int64_t blocks = (n + launch::kSumSquaresBlock - 1) / launch::kSumSquaresBlock;
  Scratch partials(static_cast<size_t>(blocks > 0 ? blocks : 1) * sizeof(double), stream_of(ex));
  launch::sum_of_squares(stream_of(ex), x.data<float>(), n, static_cast<double*>(partials.get()),
                         out.data<float>());
}

}  // namespace loom::cuda
