// Rollouts for agent RL through the serving engine (issue 20): many episodes at once on an
// in-process Engine (its scheduler, prefix cache and sampler, as loom-server runs them), each a
// multi-turn conversation: the model's turn is sampled up to the chat format's end-of-turn marker,
// parsed by the engine's tool-call parser, handed to the episode's environment, and the tool
// results it returns are rendered by the chat template and appended; the next turn's prompt is
// the whole token sequence so far, so the prefix cache serves every earlier turn.
//
// The trajectory keeps exactly the tokens the engine saw: the model's own sampled tokens (with
// their logprobs), and the template's text around them encoded piece by piece as loom-server
// encodes prompts (special tokens only in the template's markup). Sampling is at temperature 1
// with no truncation of the distribution, because the engine reports the logprob of the raw
// logits and that is the behaviour policy's only then.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/tool_call_parser.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "trainer/rl/environment.h"
#include "trainer/rl/trajectory.h"

namespace loom {

// How a model family's chat is written and read.
struct ChatSetup {
  ChatFormat format = ChatFormat::kNative;
  ToolCallSyntax syntax = ToolCallSyntax::kNative;
  std::string end_of_turn;  // the marker a model turn stops at ("<|end|>")
  std::string after_end;    // what the template writes after it ("\n")
  // The marker's id when the tokenizer spells it as one special token (the engine then stops on
  // the id, whose text a detokenizer may skip), else -1 (it stops on the text).
  int32_t end_of_turn_id = -1;
};
absl::StatusOr<ChatSetup> chat_setup_for(ChatFormat format, const Tokenizer& tokenizer);

struct RolloutOptions {
  int max_turns = 4;                     // model turns per episode
  int max_turn_tokens = 96;              // tokens one model turn may sample
  int64_t max_trajectory_tokens = 4096;  // the whole sequence (prompt and every turn)
  // Ask the engine for every position's experts (Request::return_routed_experts) and keep them in
  // Trajectory::routed_experts, for routing replay. Positions the prefix cache served come from the
  // episode of the same rollout call that computed them (same tokens up to there, same weights).
  bool record_routing = false;
  absl::Status validate() const;
};

struct EpisodeSpec {
  Environment* env = nullptr;  // not owned; reset by the rollout
  uint64_t env_seed = 0;
  uint64_t sample_seed = 0;  // seeds the engine's draws (turn k uses sample_seed + k)
};

// Runs every episode to its end: a final answer, a turn cut at max_turn_tokens, the model's EOS,
// max_turns turns, or a next prompt over max_trajectory_tokens (the last three: truncated), or a
// tool call without a name or whose arguments are not JSON (malformed: the template cannot render
// it back). The
// trajectories come back in the order of `episodes`, with tokens, sampled mask, behaviour
// logprobs, turns, response tokens, the environment's reward (task_reward) and the weight version
// the engine sampled them under (version) filled; FailedPrecondition if the engine's weights
// change while an episode runs (its turns would mix two policies).
// InvalidArgument when a prompt does not fit the engine; the engine's own errors as they are.
absl::StatusOr<std::vector<Trajectory>> run_rollouts(Engine& engine, const Tokenizer& tokenizer,
                                                     const ChatSetup& chat,
                                                     const std::vector<EpisodeSpec>& episodes,
                                                     const RolloutOptions& options);

}  // namespace loom
