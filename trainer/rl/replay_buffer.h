// A bounded replay of recent trajectory groups with their behaviour and rollout-time logprobs, so
// that a step can train on a few earlier groups beside the fresh ones (experience reuse). The
// clipped importance ratio to each group's own rollout-time policy keeps the reuse safe; groups
// older than max_age weight versions are dropped before they can be drawn.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "trainer/rl/trajectory.h"

namespace loom {

class ReplayBuffer {
 public:
  // capacity: groups kept (the oldest go first); 0 disables the buffer. max_age >= 1.
  ReplayBuffer(int capacity, int64_t max_age) : capacity_(capacity), max_age_(max_age) {}

  // Keeps `group` (a copy), dropping the oldest beyond the capacity.
  void add(const TrajectoryGroup& group);
  // Up to `count` distinct groups drawn uniformly without replacement from those sampled at
  // versions in [version - max_age, version - 1] (after dropping older ones); the pointers stay
  // valid until the next add() or sample().
  std::vector<const TrajectoryGroup*> sample(int count, int64_t version, std::mt19937_64& rng);
  size_t size() const { return groups_.size(); }

 private:
  int capacity_;
  int64_t max_age_;
  std::deque<TrajectoryGroup> groups_;  // oldest first
};

}  // namespace loom
