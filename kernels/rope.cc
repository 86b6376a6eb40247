// Frequency tables (host) and device dispatch for kernels/rope.h.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/rope.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/rope.h"
#endif

namespace loom {

namespace {
Tensor host_f32(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}
}  // namespace

RopeTable rope_table_default(double theta, int rotary_dim, RopeStyle style) {
  RopeTable t;
  std::vector<float> inv_freq;
  t.rotary_dim = rotary_dim;
  t.style = style;
  for (int i = 0; i < rotary_dim / 2; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2, dtype=float32) / dim)), all in f32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq.push_back(1.0f / std::pow(static_cast<float>(theta), expo));
  }
  t.inv_freq = host_f32(inv_freq);
  return t;
}

RopeTable rope_table_yarn(double theta, int rotary_dim, RopeStyle style, double factor,
                          double original_max_position, double beta_fast, double beta_slow,
                          double mscale, double mscale_all_dim, double attention_factor,
                          bool truncate) {
  RopeTable t;
  std::vector<float> inv_freq;
  t.rotary_dim = rotary_dim;
  t.style = style;
  auto get_mscale = [](double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  if (attention_factor < 0) {
    attention_factor = (mscale != 0 && mscale_all_dim != 0)
                           ? get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                           : get_mscale(factor, 1.0);
  }
  t.attention_factor = static_cast<float>(attention_factor);
  const double dim = rotary_dim;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original_max_position / (rotations * 2 * M_PI))) / (2 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // the reference's guard against a zero-width ramp
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float pos_freq = std::pow(static_cast<float>(theta), expo);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq.push_back(interpolation * (1.0f - extrapolation_factor) +
                       extrapolation * extrapolation_factor);
  }
  t.inv_freq = host_f32(inv_freq);
  return t;
}

namespace {
// bf16_ok: x may be bf16 (the CUDA forward); otherwise f32 only (the CPU, every backward).
void check_rope_args(const char* op, const Tensor& x, const Tensor& positions,
                     const RopeTable& table, int64_t dim_offset, bool bf16_ok) {
  const bool dtype_ok = x.dtype() == DType::kF32 || (bf16_ok && x.dtype() == DType::kBF16);
  LOOM_CHECK(dtype_ok && x.is_contiguous(),
             "%s: x %s, expected contiguous f32 (or bf16, in the CUDA forward only)", op,
             x.describe().c_str());
  LOOM_CHECK(positions.ndim() == 1 && positions.dtype() == DType::kI64 && positions.is_contiguous(),
             "%s: positions must be contiguous i64 [T], got %s", op, positions.describe().c_str());
  LOOM_CHECK(x.ndim() == 3 && x.dim(0) == positions.dim(0) && dim_offset >= 0 &&
                 dim_offset + table.rotary_dim <= x.dim(2) && table.rotary_dim % 2 == 0 &&
                 table.inv_freq.dtype() == DType::kF32 && table.inv_freq.is_contiguous() &&
                 table.inv_freq.numel() * 2 == table.rotary_dim,
             "%s: x %s, %zu positions, rotary_dim %d, dim_offset %lld", op, x.describe().c_str(),
             static_cast<size_t>(positions.dim(0)), table.rotary_dim,
             static_cast<long long>(dim_offset));
}
}  // namespace

void rope_forward(const Exec& ex, const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset) {
  LOOM_ON_EXEC_DEVICE(ex, "rope_forward", x, positions, table.inv_freq);
  check_rope_args("rope_forward", x, positions, table, dim_offset, !ex.device.is_cpu());
  if (ex.device.is_cpu()) return cpu::rope_apply(x, positions, table, dim_offset, false);
#ifdef LOOM_WITH_CUDA
  return cuda::rope_forward(ex, x, positions, table, dim_offset);
#else
  no_kernel_for(ex, "rope_forward");
#endif
}

void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& positions,
                   const RopeTable& table, int64_t dim_offset) {
  LOOM_ON_EXEC_DEVICE(ex, "rope_backward", dx, positions, table.inv_freq);
  check_rope_args("rope_backward", dx, positions, table, dim_offset, false);
  if (ex.device.is_cpu()) return cpu::rope_apply(dx, positions, table, dim_offset, true);
#ifdef LOOM_WITH_CUDA
  return cuda::rope_backward(ex, dx, positions, table, dim_offset);
#else
  no_kernel_for(ex, "rope_backward");
#endif
}

}  // namespace loom
