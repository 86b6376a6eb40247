#include "trainer/rl/environment.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "trainer/rl/arithmetic_env.h"
#include "trainer/rl/retrieval_env.h"

namespace loom {

absl::Status ArithmeticEnvOptions::validate() const {
  if (operands < 2 || operands > 8)
    return absl::InvalidArgumentError(
        absl::StrCat("env.arithmetic.operands: ", operands, " outside [2, 8]"));
  if (max_operand < 1 || max_operand > 1000000)
    return absl::InvalidArgumentError(
        absl::StrCat("env.arithmetic.max_operand: ", max_operand, " outside [1, 1000000]"));
  if (ops.empty() || ops.find_first_not_of("+-*") != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("env.arithmetic.ops: '", ops, "' (one or more of + - *)"));
  return absl::OkStatus();
}

absl::Status RetrievalEnvOptions::validate() const {
  if (records < 1 || records > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("env.retrieval.records: ", records, " outside [1, 4096]"));
  if (filler < 0 || filler > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("env.retrieval.filler: ", filler, " outside [0, 64]"));
  if (max_results < 1 || max_results > 64)
    return absl::InvalidArgumentError(
        absl::StrCat("env.retrieval.max_results: ", max_results, " outside [1, 64]"));
  return absl::OkStatus();
}

absl::Status EnvironmentConfig::validate() const {
  if (name == "arithmetic") return arithmetic.validate();
  if (name == "retrieval") return retrieval.validate();
  return absl::InvalidArgumentError(
      absl::StrCat("env.name: '", name, "' (arithmetic or retrieval)"));
}

std::vector<ChatMessage> direct_answer_demonstration(
    const std::vector<ChatMessage>& demonstration) {
  std::vector<ChatMessage> direct;
  for (const ChatMessage& m : demonstration) {
    if (m.role == "assistant") break;
    direct.push_back(m);
  }
  if (!demonstration.empty() && demonstration.back().role == "assistant" &&
      demonstration.back().tool_calls.empty())
    direct.push_back(demonstration.back());
  return direct;
}

absl::StatusOr<std::unique_ptr<Environment>> make_environment(const EnvironmentConfig& config) {
  if (absl::Status st = config.validate(); !st.ok()) return st;
  if (config.name == "arithmetic") return std::make_unique<ArithmeticEnv>(config.arithmetic);
  return std::make_unique<RetrievalEnv>(config.retrieval);
}

EnvStep answer_or_run_tool(const ChatMessage& reply, int64_t answer, std::string_view tool,
                           absl::FunctionRef<std::string(std::string_view arguments_json)> run,
                           bool& done, double& reward) {
  EnvStep s;
  if (done) {
    s.done = true;
    return s;
  }
  if (reply.tool_calls.empty()) {
    int64_t v = 0;
    reward = last_integer(reply.content, &v) && v == answer ? 1.0 : 0.0;
    done = true;
    s.done = true;
    return s;
  }
  for (const ToolCall& c : reply.tool_calls) {
    ChatMessage m{.role = "tool"};
    m.tool_call_id = c.id;
    m.content =
        c.name == tool ? run(c.arguments_json) : absl::StrCat("error: unknown tool '", c.name, "'");
    s.messages.push_back(std::move(m));
  }
  return s;
}

bool last_integer(std::string_view text, int64_t* value) {
  size_t end = text.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0) return false;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  if (end - begin > 18) return false;
  int64_t v = 0;
  for (size_t i = begin; i < end; ++i) v = v * 10 + (text[i] - '0');
  if (begin > 0 && text[begin - 1] == '-') v = -v;
  *value = v;
  return true;
}

}  // namespace loom
