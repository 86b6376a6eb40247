// Environments for agent RL (issue 20): multi-turn tasks in the chat format of the model family,
// where the model may call tools and is rewarded only for a correct final answer.
//
// An episode: reset(seed) gives the opening messages and the tools; then each model turn, parsed
// by the engine's own tool-call parser (engine/chat/tool_call_parser.h, as loom-server parses
// replies) into an assistant message, goes to step(): a turn with tool calls gets one tool
// message per call back (done = false); a turn without calls is the final answer (done = true),
// after which reward() is the episode's reward. The rollout (rollout.h) renders the messages with
// the chat template; environments never spell a template. Not thread-safe: one episode at a
// time per object (the rollout makes one object per episode).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"

namespace loom {

struct EnvReset {
  std::vector<ChatMessage> messages;  // the conversation before the model's first turn
  std::vector<ToolDefinition> tools;
};

struct EnvStep {
  std::vector<ChatMessage> messages;  // tool results (role "tool"), one per call, in call order
  bool done = false;
};

class Environment {
 public:
  virtual ~Environment() = default;
  // Starts an episode; the same seed gives the same episode.
  virtual EnvReset reset(uint64_t seed) = 0;
  // The model's turn (role "assistant": content and tool calls). After done, further calls give
  // done again and change nothing.
  virtual EnvStep step(const ChatMessage& reply) = 0;
  // 1 for a correct final answer, else 0 (also before the episode is done).
  virtual double reward() const = 0;
  // The conversation an oracle would have for the current episode (its opening messages, each
  // right call and its result, the right answer): for tests and warm-start demonstrations.
  virtual std::vector<ChatMessage> demonstration() const = 0;
};

struct ArithmeticEnvOptions {
  int operands = 2;       // numbers in the question (one calculator call per operation)
  int max_operand = 99;   // operands drawn from [0, max_operand]
  std::string ops = "+";  // operations drawn from these characters: + - *
  absl::Status validate() const;
};

struct RetrievalEnvOptions {
  int records = 200;    // names with a code in the document
  int filler = 2;       // filler sentences after each record
  int max_results = 3;  // lines a search returns at most
  absl::Status validate() const;
};

struct EnvironmentConfig {
  std::string name = "arithmetic";  // "arithmetic" or "retrieval"
  ArithmeticEnvOptions arithmetic;
  RetrievalEnvOptions retrieval;
  absl::Status validate() const;
};

// `demonstration` answered at once: its messages before the first assistant turn and its final
// answer, without the tool calls and results between them (a demonstrator who skips the tools).
std::vector<ChatMessage> direct_answer_demonstration(const std::vector<ChatMessage>& demonstration);

// A fresh environment. InvalidArgument for an unknown name or bad options.
absl::StatusOr<std::unique_ptr<Environment>> make_environment(const EnvironmentConfig& config);

// The last integer written in `text` (an optional '-' and digits; at most 18 digits), if any:
// what the built-in environments compare with the right answer.
bool last_integer(std::string_view text, int64_t* value);

// The built-in environments' step: once `done`, nothing; a reply without tool calls is the final
// answer (reward 1 when its last integer is `answer`, else 0; the episode ends); otherwise every
// call gets a tool result in call order, from `run` for calls of `tool` and an error naming any
// other tool. `done` and `reward` are the environment's own state.
EnvStep answer_or_run_tool(const ChatMessage& reply, int64_t answer, std::string_view tool,
                           absl::FunctionRef<std::string(std::string_view arguments_json)> run,
                           bool& done, double& reward);

}  // namespace loom
