// What a layer's backward needs to know about a training batch: the rows of each sequence. The
// trainer runs every sequence from a fresh state (position 0, zero recurrent and conv states), so
// a batch with cached positions is refused rather than trained from the wrong state.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward_context.h"

namespace loom {

using RowSpan = std::pair<int64_t, int64_t>;  // rows [first, second) of one sequence

// Unimplemented naming the layer unless every defined weight is f32: training keeps f32 master
// weights (a model loaded with Placement::trainable).
absl::Status require_f32_weights(int layer, std::string_view kind,
                                 std::initializer_list<const Tensor*> weights);

// The sequences of ctx.batch (its host copies when it has them, else the step data read back from
// the device). FailedPrecondition if any has past positions.
absl::StatusOr<std::vector<RowSpan>> training_sequences(const BatchLayout& batch);

}  // namespace loom
