// What a layer's backward needs to know about a training batch: the rows of each sequence. The
// trainer runs every sequence from a fresh state (position 0, zero recurrent and conv states), so
// a batch with cached positions is refused rather than trained from the wrong state.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward_context.h"

namespace loom {

using RowSpan = std::pair<int64_t, int64_t>;  // rows [first, second) of one sequence

// The sequences of ctx.batch (host step data). FailedPrecondition if any has past positions.
absl::StatusOr<std::vector<RowSpan>> training_sequences(const BatchLayout& batch);

}  // namespace loom
