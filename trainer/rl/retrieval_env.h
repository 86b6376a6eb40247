// The retrieval task (issue 20): a long document (a registry of names and codes, each record
// followed by filler sentences) that only a `search` tool can read; the user asks for one name's
// code. search({"query": "kalomi"}) returns the document's lines holding every word of the query
// (case-insensitive), at most max_results of them. The reward is 1 only when the final answer's
// last integer is the code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/rl/environment.h"

namespace loom {

class RetrievalEnv : public Environment {
 public:
  // REQUIRES: options.validate().ok().
  explicit RetrievalEnv(const RetrievalEnvOptions& options) : options_(options) {}

  EnvReset reset(uint64_t seed) override;
  EnvStep step(const ChatMessage& reply) override;
  double reward() const override { return reward_; }
  std::vector<ChatMessage> demonstration() const override { return demonstration_; }

  // The search tool's reply to one call's arguments (JSON text) over the current document.
  std::string search(std::string_view arguments_json) const;
  // The current episode's document, one line per sentence.
  const std::vector<std::string>& document() const { return lines_; }

 private:
  RetrievalEnvOptions options_;
  std::vector<std::string> lines_;
  int64_t answer_ = 0;
  bool done_ = true;
  double reward_ = 0;
  std::vector<ChatMessage> demonstration_;
};

}  // namespace loom
