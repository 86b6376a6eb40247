#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace loom::cpu {

// Per pair i with c = cos(theta_i) * af and s = sin(theta_i) * af (af the attention factor):
//   forward:  (a, b) = x at the pair's input slots;  out(i) = a c - b s,  out(i + half) = b c + a s
//   inverse:  (p, q) = x at (i, i + half);  in-slot a = p c + q s,  in-slot b = q c - p s
// The pair's input slots are (i, i + half) for kHalf and (2i, 2i + 1) for kInterleaved; the inverse
// is the transpose of the forward (R^T = R(-theta) per pair, the permutation undone).
void rope_apply(const Tensor& x, const Tensor& positions, const RopeTable& table,
                int64_t dim_offset, bool inverse) {
  const int64_t t_count = x.dim(0), heads = x.dim(1), d = x.dim(2);
  const int half = table.rotary_dim / 2;
  const bool interleaved = table.style == RopeStyle::kInterleaved;
  float* base = x.data<float>();
  const int64_t* pos_of = positions.data<int64_t>();
  const float* inv_freq = table.inv_freq.data<float>();
  // Tokens are independent: threads split them, nothing is reduced across tokens.
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
      for (int i = 0; i < half; ++i) {
        const int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        if (!inverse) {
          const float a = v[ia], b = v[ib];
          tmp[i] = a * c[i] - b * s[i];
          tmp[i + half] = b * c[i] + a * s[i];
        } else {
          const float p = v[i], q = v[i + half];
          tmp[ia] = p * c[i] + q * s[i];
          tmp[ib] = q * c[i] - p * s[i];
        }
      }
      for (int i = 0; i < table.rotary_dim; ++i) v[i] = tmp[i];
    }
  }
}

}  // namespace loom::cpu
