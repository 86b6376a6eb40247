// Builds the rotary table for a layer from the model's RopeConfig.
#pragma once

#include "kernels/rope.h"
#include "weights/model_config.h"

namespace loom {

// head_dim: the dims RoPE may touch (MLA: qk_rope_head_dim; GQA: head_dim, of which
// partial_rotary_factor is rotated). Requires rope.type != kNone. The table lives on `device`
// (the model's: rope_forward reads it there).
RopeTable make_rope_table(const RopeConfig& rope, int head_dim, Device device = Device::kCpu);

// The MLA softmax-scale multiplier under YaRN: mscale(factor, mscale_all_dim)^2 when
// mscale_all_dim is set (DeepSeek's yarn_apply_mscale), else 1.
float yarn_softmax_scale_multiplier(const RopeConfig& rope);

}  // namespace loom
