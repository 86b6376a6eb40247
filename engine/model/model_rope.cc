// Model::set_rope_theta: a new RoPE base for the rotary layers of a loaded model (staged context
// extension in the trainer). Only the config's theta changes; each rotary mixer rebuilds its table
// from the whole RopeConfig with make_rope_table, as at load, so the tables depend on the config
// alone and setting a theta back restores the original bits.
#include "engine/model/model.h"

namespace loom {

int Model::set_rope_theta(double theta) {
  cfg_.rope.theta = theta;
  if (cfg_.rope.type == RopeConfig::Type::kNone) return 0;
  int rotary = 0;
  for (Layer& layer : layers_)
    if (layer.mixer != nullptr && layer.mixer->rebuild_rope(cfg_.rope, placement_.device)) ++rotary;
  return rotary;
}

}  // namespace loom
