// The arithmetic task (issue 20): "What is (12 + 34) * 5?" with a `calculator` tool that applies
// one operation to two integers ({"a": 12, "op": "+", "b": 34} -> "46"). The reward is 1 only
// when the final answer's last integer is the right result; calls are allowed, not required.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/rl/environment.h"

namespace loom {

class ArithmeticEnv : public Environment {
 public:
  // REQUIRES: options.validate().ok().
  explicit ArithmeticEnv(const ArithmeticEnvOptions& options) : options_(options) {}

  EnvReset reset(uint64_t seed) override;
  EnvStep step(const ChatMessage& reply) override;
  double reward() const override { return reward_; }
  std::vector<ChatMessage> demonstration() const override { return demonstration_; }

  // The calculator's reply to one call's arguments (JSON text): the result, or "error: ..." for
  // arguments that are not {"a": integer, "op": "+"|"-"|"*", "b": integer} or a result outside
  // 64 bits.
  static std::string calculate(std::string_view arguments_json);

 private:
  ArithmeticEnvOptions options_;
  int64_t answer_ = 0;
  bool done_ = true;
  double reward_ = 0;
  std::vector<ChatMessage> demonstration_;
};

}  // namespace loom
