#include "trainer/rl/replay_buffer.h"

#include <algorithm>

namespace loom {

void ReplayBuffer::add(const TrajectoryGroup& group) {
  if (capacity_ <= 0) return;
  groups_.push_back(group);
  while (static_cast<int>(groups_.size()) > capacity_) groups_.pop_front();
}

std::vector<const TrajectoryGroup*> ReplayBuffer::sample(int count, int64_t version,
                                                         std::mt19937_64& rng) {
  while (!groups_.empty() && groups_.front().version < version - max_age_) groups_.pop_front();
  std::vector<const TrajectoryGroup*> eligible;
  for (const TrajectoryGroup& g : groups_)
    if (g.version < version) eligible.push_back(&g);
  // A partial Fisher-Yates shuffle: the first `count` entries are a uniform draw.
  const size_t k = std::min<size_t>(std::max(count, 0), eligible.size());
  for (size_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<size_t> pick(i, eligible.size() - 1);
    std::swap(eligible[i], eligible[pick(rng)]);
  }
  eligible.resize(k);
  return eligible;
}

}  // namespace loom
