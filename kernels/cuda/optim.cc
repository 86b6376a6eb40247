// Host side of the CUDA optimizer kernels (kernels/cuda/optim.h): the CPU's scalar setup
// (kernels/cpu/optim.cc), then the launches.
#include "kernels/cuda/optim.h"

#include <climits>
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

void adamw_update_many(const Exec& ex, const AdamWStep& s, std::span<const AdamWTensor> tensors,
                       const GradScale& scale) {
  check_on_device("adamw_update_many", "sum_squares", scale.sum_squares);
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  launch::AdamWLaunch a{};
  a.beta1 = s.beta1;
  a.beta2 = s.beta2;
  a.eps = s.eps;
  a.step_size = static_cast<float>(s.lr / bc1);
  a.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  a.sum_squares = scale.sum_squares.data<float>();
  a.mean = scale.mean;
  a.clip_norm = scale.clip_norm;
  auto flush = [&] {
    if (a.blocks > 0) launch::adamw_many(stream_of(ex), a);
    a.count = 0;
    a.blocks = 0;
  };
  for (const AdamWTensor& t : tensors) {
    for (const Tensor* x : {&t.param, &t.grad, &t.m, &t.v})
      check_on_device("adamw_update_many", "tensor", *x);
    const int64_t n = t.param.numel();
    if (n == 0) continue;
    const int64_t blocks = (n + launch::kAdamWBlock - 1) / launch::kAdamWBlock;
    if (a.count == launch::kAdamWTensors || a.blocks + blocks > INT32_MAX) flush();
    launch::AdamWEntry& e = a.e[a.count++];
    e = {t.param.data<float>(),
         t.grad.data<float>(),
         t.m.data<float>(),
         t.v.data<float>(),
         n,
         a.blocks,
         1.0f - s.lr * (t.decay ? s.weight_decay : 0.0f)};
    a.blocks += static_cast<int>(blocks);
  }
  flush();
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
