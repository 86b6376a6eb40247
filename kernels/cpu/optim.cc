#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::cpu {

void adamw_update(const AdamWStep& s, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v) {
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  const float step_size = static_cast<float>(s.lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    mp[i] = s.beta1 * mp[i] + (1.0f - s.beta1) * gi;
    vp[i] = s.beta2 * vp[i] + (1.0f - s.beta2) * gi * gi;
    p[i] = p[i] * decay - step_size * mp[i] / (std::sqrt(vp[i]) / sqrt_bc2 + s.eps);
  }
}

void sum_of_squares(const Tensor& x, const Tensor& out) {
  // Fixed blocks summed in block order: the same result whatever the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  const float* p = x.data<float>();
  std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    double acc = 0.0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) acc += static_cast<double>(p[i]) * p[i];
    partial[b] = acc;
  }
  double total = 0.0;
  for (double e : partial) total += e;
  out.data<float>()[0] = static_cast<float>(total);
}

}  // namespace loom::cpu
