#include "trainer/rl/retrieval_env.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

constexpr const char* kSyllables[] = {"ka", "lo", "mi", "ru", "te", "vo", "zan", "pe",
                                      "si", "da", "no", "gu", "fe", "bi", "xo",  "ha"};
constexpr const char* kFiller[] = {"The registry is kept in alphabetical order by clerk.",
                                   "Codes are issued once a year.",
                                   "Nobody remembers who wrote the first entry.",
                                   "Some pages are stained with tea.",
                                   "The archive closes at noon on Fridays.",
                                   "Old codes are never reused.",
                                   "Each clerk signs the page they write.",
                                   "The ink is blue on most pages."};

ToolDefinition search_tool() {
  return {"search", "Returns the lines of the registry that contain every word of the query.",
          R"({"type": "object", "properties": {"query": {"type": "string"}}, )"
          R"("required": ["query"]})"};
}

}  // namespace

EnvReset RetrievalEnv::reset(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> syllable(0, 15), code(1000, 9999), count(2, 3);
  std::uniform_int_distribution<size_t> filler(0, std::size(kFiller) - 1);
  std::set<std::string> used;
  std::vector<std::pair<std::string, int>> records;
  while (static_cast<int>(records.size()) < options_.records) {
    std::string name;
    for (int k = count(rng); k > 0; --k) name += kSyllables[syllable(rng)];
    if (!used.insert(name).second) continue;
    records.emplace_back(name, code(rng));
  }
  lines_.clear();
  for (const auto& [name, value] : records) {
    lines_.push_back(absl::StrCat("The code of ", name, " is ", value, "."));
    for (int k = 0; k < options_.filler; ++k) lines_.push_back(kFiller[filler(rng)]);
  }
  const auto& [name, value] =
      records[std::uniform_int_distribution<size_t>(0, records.size() - 1)(rng)];
  answer_ = value;
  EnvReset r;
  r.tools = {search_tool()};
  r.messages.push_back({.role = "user",
                        .content = absl::StrCat("The registry lists the codes of ", records.size(),
                                                " names. What is the code of ", name, "?")});
  done_ = false;
  reward_ = 0;
  demonstration_ = r.messages;
  ChatMessage call{.role = "assistant"};
  call.tool_calls.push_back({"call_0", "search", absl::StrCat(R"({"query": ")", name, R"("})")});
  ChatMessage result{.role = "tool", .content = search(call.tool_calls[0].arguments_json)};
  result.tool_call_id = "call_0";
  demonstration_.push_back(std::move(call));
  demonstration_.push_back(std::move(result));
  demonstration_.push_back(
      {.role = "assistant", .content = absl::StrCat("The code of ", name, " is ", value, ".")});
  return r;
}

std::string RetrievalEnv::search(std::string_view arguments_json) const {
  const auto args = nlohmann::json::parse(arguments_json, nullptr, false);
  if (args.is_discarded() || !args.is_object() || !args.contains("query") ||
      !args["query"].is_string())
    return "error: the arguments must be {\"query\": string}";
  const std::string query = absl::AsciiStrToLower(args["query"].get<std::string>());
  const std::vector<std::string> words =
      absl::StrSplit(query, absl::ByAnyChar(" \t\n.,?!"), absl::SkipEmpty());
  if (words.empty()) return "error: an empty query";
  std::vector<std::string> hits;
  for (const std::string& line : lines_) {
    const std::string lower = absl::AsciiStrToLower(line);
    const std::vector<std::string> line_words =
        absl::StrSplit(lower, absl::ByAnyChar(" \t\n.,?!"), absl::SkipEmpty());
    bool all = true;
    for (const std::string& w : words)
      all = all && std::find(line_words.begin(), line_words.end(), w) != line_words.end();
    if (all) hits.push_back(line);
    if (static_cast<int>(hits.size()) == options_.max_results) break;
  }
  return hits.empty() ? "no match" : absl::StrJoin(hits, "\n");
}

EnvStep RetrievalEnv::step(const ChatMessage& reply) {
  return answer_or_run_tool(
      reply, answer_, "search", [&](std::string_view args) { return search(args); }, done_,
      reward_);
}

}  // namespace loom
