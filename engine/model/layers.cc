// The default backward of a layer that has none yet: training through it is refused by name.
#include "engine/model/layers.h"

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status Mixer::backward(const ForwardContext&, const Tensor&, int layer, const Tensor&,
                             const Tensor&, Gradients&) const {
  return absl::UnimplementedError(
      absl::StrCat("training: layer ", layer, "'s token mixer has no backward pass yet"));
}

absl::Status Ffn::backward(const ForwardContext&, const Tensor&, const Tensor&, const Tensor&,
                           Gradients&) const {
  return absl::UnimplementedError("training: this FFN has no backward pass yet");
}

}  // namespace loom
