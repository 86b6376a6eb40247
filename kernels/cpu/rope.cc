#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace loom::cpu {

void rope_forward(const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK(positions.ndim() == 1 && positions.dtype() == DType::kI64 && positions.is_contiguous(),
             "rope_forward: positions must be contiguous i64 [T], got %s",
             positions.describe().c_str());
  LOOM_CHECK(x.ndim() == 3 && x.dim(0) == positions.dim(0) && dim_offset >= 0 &&
                 dim_offset + table.rotary_dim <= x.dim(2) && table.rotary_dim % 2 == 0 &&
                 table.inv_freq.dtype() == DType::kF32 && table.inv_freq.is_contiguous() &&
                 table.inv_freq.numel() * 2 == table.rotary_dim,
             "rope_forward: x %s, %zu positions, rotary_dim %d", x.describe().c_str(),
             static_cast<size_t>(positions.dim(0)), table.rotary_dim);
  const int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2);
  const int half = table.rotary_dim / 2;
  float* base = x.data<float>();
  const int64_t* pos_of = positions.data<int64_t>();
  const float* inv_freq = table.inv_freq.data<float>();
#pragma omp parallel for schedule(static) if (t_count * heads * d > 32768)
  for (int64_t t = 0; t < t_count; ++t) {
    // cos/sin in f32 of an f32 angle, like the reference's f32 rotary tables.
    std::vector<float> c(half), s(half), tmp(table.rotary_dim);
    const float pos = static_cast<float>(pos_of[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = inv_freq[i] * pos;
      c[i] = std::cos(angle) * table.attention_factor;
      s[i] = std::sin(angle) * table.attention_factor;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = base + (t * heads + h) * d + dim_offset;
      if (table.style == RopeStyle::kHalf) {
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          tmp[i] = a * c[i] - b * s[i];
          tmp[i + half] = b * c[i] + a * s[i];
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          tmp[i] = a * c[i] - b * s[i];
          tmp[i + half] = b * c[i] + a * s[i];
        }
      }
      for (int i = 0; i < table.rotary_dim; ++i) v[i] = tmp[i];
    }
  }
}

}  // namespace loom::cpu
