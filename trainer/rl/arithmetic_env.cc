#include "trainer/rl/arithmetic_env.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

ToolDefinition calculator_tool() {
  return {"calculator", "Applies one operation to two integers.",
          R"({"type": "object", "properties": {"a": {"type": "integer"}, )"
          R"("op": {"type": "string", "enum": ["+", "-", "*"]}, "b": {"type": "integer"}}, )"
          R"("required": ["a", "op", "b"]})"};
}

// a op b, false on overflow.
bool apply(char op, int64_t a, int64_t b, int64_t* out) {
  switch (op) {
    case '+':
      return !__builtin_add_overflow(a, b, out);
    case '-':
      return !__builtin_sub_overflow(a, b, out);
    default:
      return !__builtin_mul_overflow(a, b, out);
  }
}

std::string call_arguments(int64_t a, char op, int64_t b) {
  return absl::StrCat(R"({"a": )", a, R"(, "op": ")", std::string(1, op), R"(", "b": )", b, "}");
}

}  // namespace

std::string ArithmeticEnv::calculate(std::string_view arguments_json) {
  const auto args = nlohmann::json::parse(arguments_json, nullptr, false);
  if (args.is_discarded() || !args.is_object()) return "error: the arguments are not a JSON object";
  for (const char* key : {"a", "b"})
    if (!args.contains(key) || !args[key].is_number_integer())
      return absl::StrCat("error: '", key, "' must be an integer");
  if (!args.contains("op") || !args["op"].is_string()) return "error: 'op' must be a string";
  const std::string op = args["op"].get<std::string>();
  if (op != "+" && op != "-" && op != "*") return "error: 'op' must be +, - or *";
  if ((args["a"].is_number_unsigned() && args["a"].get<uint64_t>() > INT64_MAX) ||
      (args["b"].is_number_unsigned() && args["b"].get<uint64_t>() > INT64_MAX))
    return "error: an operand outside 64 bits";
  int64_t result = 0;
  if (!apply(op[0], args["a"].get<int64_t>(), args["b"].get<int64_t>(), &result))
    return "error: the result does not fit in 64 bits";
  return absl::StrCat(result);
}

EnvReset ArithmeticEnv::reset(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> operand(0, options_.max_operand);
  std::uniform_int_distribution<size_t> which(0, options_.ops.size() - 1);
  std::vector<int64_t> nums;
  std::vector<char> ops;
  std::vector<int64_t> partial;  // the result after each operation, left to right
  for (bool ok = false; !ok;) {  // redraw the rare question whose result overflows
    nums.assign(1, operand(rng));
    ops.clear();
    partial.clear();
    ok = true;
    int64_t acc = nums[0];
    for (int k = 1; k < options_.operands; ++k) {
      nums.push_back(operand(rng));
      ops.push_back(options_.ops[which(rng)]);
      ok = ok && apply(ops.back(), acc, nums.back(), &acc);
      partial.push_back(acc);
    }
  }
  answer_ = partial.back();
  // Left to right, with parentheses so that the order is the written one: ((a + b) * c) - d.
  std::string question = absl::StrCat(nums[0]);
  for (size_t k = 0; k < ops.size(); ++k) {
    if (k > 0) question = absl::StrCat("(", question, ")");
    absl::StrAppend(&question, " ", std::string(1, ops[k]), " ", nums[k + 1]);
  }
  EnvReset r;
  r.tools = {calculator_tool()};
  r.messages.push_back({.role = "user", .content = absl::StrCat("What is ", question, "?")});
  done_ = false;
  reward_ = 0;
  demonstration_ = r.messages;
  int64_t acc = nums[0];
  for (size_t k = 0; k < ops.size(); ++k) {
    const std::string id = absl::StrCat("call_", k);
    ChatMessage call{.role = "assistant"};
    call.tool_calls.push_back({id, "calculator", call_arguments(acc, ops[k], nums[k + 1])});
    acc = partial[k];
    ChatMessage result{.role = "tool", .content = absl::StrCat(acc)};
    result.tool_call_id = id;
    demonstration_.push_back(std::move(call));
    demonstration_.push_back(std::move(result));
  }
  demonstration_.push_back(
      {.role = "assistant", .content = absl::StrCat("The answer is ", answer_, ".")});
  return r;
}

EnvStep ArithmeticEnv::step(const ChatMessage& reply) {
  return answer_or_run_tool(
      reply, answer_, "calculator", [&](std::string_view args) { return calculate(args); }, done_,
      reward_);
}

}  // namespace loom
