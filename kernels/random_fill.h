// Counter-based random fill: the values of generated (random) weights, written where the tensor
// lives (engine/model/random_weights.h). Element i of a tensor depends only on the fill's key and
// its counter (first + i), never on the device, the thread count or the order of filling: the host
// and a GPU write the same bits (kernels/random_fill_math.h has the formulas).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

struct RandomFillParams {
  uint64_t key = 0;         // the tensor's stream (random_fill_key)
  int64_t first = 0;        // counter of dst's first element within the whole tensor
  float center = 0.0f;      // values uniform in (center - half_width, center + half_width)
  float half_width = 0.0f;  // 0: every value is `center`
};

// The stream of tensor `name` under `seed` (a hash of both; the same on every device).
uint64_t random_fill_key(uint64_t seed, std::string_view name);

// dst[i] = the value of counter first + i, stored in dst's dtype (f32, or bf16 rounded to nearest
// even). dst: contiguous, f32 or bf16, on ex.device; half_width finite and >= 0.
void random_fill(const Exec& ex, const Tensor& dst, const RandomFillParams& p);

}  // namespace loom
