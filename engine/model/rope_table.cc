#include "engine/model/rope_table.h"

#include <cmath>

namespace loom {

RopeTable make_rope_table(const RopeConfig& rope, int head_dim, Device device) {
  const int rotary = static_cast<int>(head_dim * rope.partial_rotary_factor) / 2 * 2;
  const RopeStyle style = rope.interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf;
  RopeTable table =
      rope.type == RopeConfig::Type::kYarn
          ? rope_table_yarn(rope.theta, rotary, style, rope.factor, rope.original_max_position,
                            rope.beta_fast, rope.beta_slow, rope.mscale, rope.mscale_all_dim,
                            rope.attention_factor, rope.truncate)
          : rope_table_default(rope.theta, rotary, style);
  table.inv_freq = table.inv_freq.to(device);  // built on the host
  return table;
}

float yarn_softmax_scale_multiplier(const RopeConfig& rope) {
  if (rope.type != RopeConfig::Type::kYarn || rope.mscale_all_dim == 0 || rope.factor <= 1.0)
    return 1.0f;
  const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
  return static_cast<float>(m * m);
}

}  // namespace loom
