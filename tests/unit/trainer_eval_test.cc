// The evaluation machinery (trainer/eval.h): an oracle that answers every prompt with the answer
// the training task's own example has after exactly that prefix scores 1.0 on every task (so the
// prompts are the training layout, token for token), wrong or malformed answers score 0, bad
// options are refused, and a run through the engine on a fixture model prints the promised lines.
#include <cstdio>
#include <string>
#include <vector>

#include "engine_test_support.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/eval.h"

namespace loom {
namespace {

// Answers a prompt when it is a prefix of one of `examples` that ends right before a scored
// stretch: with that stretch's tokens (tokens[k] while mask[k - 1] = 1). Anything else is a miss
// (answered with nothing).
class OracleGenerator : public Generator {
 public:
  explicit OracleGenerator(std::vector<Example> examples) : examples_(std::move(examples)) {}

  absl::StatusOr<std::vector<std::vector<int32_t>>> generate(
      const std::vector<GenerationRequest>& requests) override {
    std::vector<std::vector<int32_t>> out;
    for (const GenerationRequest& r : requests) {
      out.push_back(answer(r.prompt));
      if (out.back().empty()) ++misses;
      EXPECT_LE(out.back().size(), static_cast<size_t>(r.max_tokens));
      ++requests_seen;
    }
    return out;
  }

  int misses = 0, requests_seen = 0;

 private:
  std::vector<int32_t> answer(const std::vector<int32_t>& p) const {
    for (const Example& ex : examples_) {
      if (p.empty() || p.size() >= ex.tokens.size() || !ex.loss_mask[p.size() - 1]) continue;
      if (!std::equal(p.begin(), p.end(), ex.tokens.begin())) continue;
      std::vector<int32_t> a;
      for (size_t k = p.size(); k < ex.tokens.size() && ex.loss_mask[k - 1]; ++k)
        a.push_back(ex.tokens[k]);
      return a;
    }
    return {};
  }
  std::vector<Example> examples_;
};

// Reads the JSON lines a run wrote.
std::vector<nlohmann::json> read_lines(std::FILE* f) {
  std::rewind(f);
  std::vector<nlohmann::json> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f) != nullptr) lines.push_back(nlohmann::json::parse(buf));
  return lines;
}

EvalOptions passkey_options() {
  EvalOptions o;
  o.task = "passkey";
  o.lengths = {300, 500};
  o.depths = {0.0, 0.5, 1.0};
  o.samples = 2;
  o.seed = 7;
  return o;
}

std::vector<Example> passkey_examples(const EvalOptions& o, const Tokenizer& tok) {
  std::vector<Example> out;
  for (uint64_t li = 0; li < o.lengths.size(); ++li)
    for (uint64_t di = 0; di < o.depths.size(); ++di)
      for (uint64_t s = 0; s < static_cast<uint64_t>(o.samples); ++s) {
        std::mt19937_64 rng = eval_case_rng(o.seed, "passkey", {li, di, s});
        out.push_back(*make_passkey(
            tok, {.context_tokens = o.lengths[li], .depth = o.depths[di], .digits = 5}, rng));
      }
  return out;
}

TEST(TrainerEval, PasskeyOracleScoresOneAndPrintsTheGrid) {
  const auto tok = Tokenizer::byte_level();
  const EvalOptions o = passkey_options();
  OracleGenerator oracle(passkey_examples(o, *tok));
  std::FILE* out = std::tmpfile();
  std::FILE* table = std::tmpfile();
  auto summary = run_eval(o, *tok, oracle, out, table);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(oracle.misses, 0);
  EXPECT_EQ(summary->score, 1.0);
  EXPECT_EQ(summary->total, 12);
  const auto lines = read_lines(out);
  ASSERT_EQ(lines.size(), 7u);  // 2 x 3 cells, the summary
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lines[i]["task"], "passkey");
    EXPECT_EQ(lines[i]["length"], o.lengths[i / 3]);
    EXPECT_EQ(lines[i]["depth"], o.depths[i % 3]);
    EXPECT_EQ(lines[i]["recall"], 1.0);
  }
  EXPECT_EQ(lines[6]["task"], "passkey");
  EXPECT_EQ(lines[6]["score"], 1.0);
  std::rewind(table);
  char head[256];
  ASSERT_NE(std::fgets(head, sizeof head, table), nullptr);
  EXPECT_NE(std::string(head).find("passkey exact recall"), std::string::npos);
  std::fclose(out);
  std::fclose(table);
}

TEST(TrainerEval, PasskeyWrongDigitsScoreZero) {
  const auto tok = Tokenizer::byte_level();
  EvalOptions o = passkey_options();
  // The oracle of another seed answers every prompt with nothing (a different haystack).
  std::vector<Example> other = passkey_examples(
      {.lengths = o.lengths, .depths = o.depths, .samples = o.samples, .seed = 8}, *tok);
  OracleGenerator wrong(std::move(other));
  auto summary = run_eval(o, *tok, wrong, nullptr, nullptr);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->score, 0.0);
  EXPECT_EQ(wrong.misses, 12);
}

TEST(TrainerEval, MqarOracleScoresOneOffByOneScoresZero) {
  const auto tok = Tokenizer::byte_level();
  EvalOptions o;
  o.task = "mqar";
  o.samples = 3;
  o.mqar.num_pairs = 8;
  std::vector<Example> examples;
  for (uint64_t s = 0; s < 3; ++s) {
    std::mt19937_64 rng = eval_case_rng(o.seed, "mqar", {s});
    MqarOptions m = o.mqar;
    m.seq_len = 64;  // the training example's padding does not change its queries
    examples.push_back(make_mqar(m, rng));
  }
  OracleGenerator oracle(examples);
  std::FILE* out = std::tmpfile();
  auto summary = run_eval(o, *tok, oracle, out, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(oracle.misses, 0);
  EXPECT_EQ(summary->total, 24);
  EXPECT_EQ(summary->score, 1.0);
  const auto lines = read_lines(out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["queries"], 8);
  EXPECT_EQ(lines[3]["score"], 1.0);
  std::fclose(out);

  // Shifting every answer by one id scores nothing.
  class OffByOne : public Generator {
   public:
    explicit OffByOne(Generator& inner) : inner_(inner) {}
    absl::StatusOr<std::vector<std::vector<int32_t>>> generate(
        const std::vector<GenerationRequest>& r) override {
      auto got = inner_.generate(r);
      for (auto& g : *got)
        for (int32_t& t : g) ++t;
      return got;
    }
    Generator& inner_;
  };
  OracleGenerator again(examples);
  OffByOne shifted(again);
  auto zero = run_eval(o, *tok, shifted, nullptr, nullptr);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->score, 0.0);
}

// Spread MQAR: the prompts run through the padding slots of a 128-token example, the oracle still
// answers every query, and an impossible layout is refused up front.
TEST(TrainerEval, MqarSpreadPromptsCoverTheLength) {
  const auto tok = Tokenizer::byte_level();
  EvalOptions o;
  o.task = "mqar";
  o.samples = 2;
  o.mqar = {.num_pairs = 8, .seq_len = 128, .spread = true};
  std::vector<Example> examples;
  for (uint64_t s = 0; s < 2; ++s) {
    std::mt19937_64 rng = eval_case_rng(o.seed, "mqar", {s});
    examples.push_back(make_mqar(o.mqar, rng));
  }
  OracleGenerator oracle(examples);
  auto summary = run_eval(o, *tok, oracle, nullptr, nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(oracle.misses, 0);
  EXPECT_EQ(summary->total, 16);
  EXPECT_EQ(summary->score, 1.0);
  o.mqar.seq_len = 20;  // 8 pairs need 32 tokens
  EXPECT_NE(o.validate().message().find("pairs"), std::string::npos);
}

std::vector<Example> tool_examples(const EvalOptions& o, const Tokenizer& tok) {
  std::vector<Example> out;
  for (uint64_t s = 0; s < static_cast<uint64_t>(o.samples); ++s) {
    std::mt19937_64 rng = eval_case_rng(o.seed, "tool", {s});
    out.push_back(*make_tool_dialogue_example(tok, o.format, make_tool_dialogue(o.tool, rng)));
  }
  return out;
}

// Rewrites the text of every answer the inner generator gives.
class TextEdit : public Generator {
 public:
  TextEdit(Generator& inner, const Tokenizer& tok, std::string from, std::string to)
      : inner_(inner), tok_(tok), from_(std::move(from)), to_(std::move(to)) {}
  absl::StatusOr<std::vector<std::vector<int32_t>>> generate(
      const std::vector<GenerationRequest>& r) override {
    auto got = inner_.generate(r);
    for (auto& g : *got) {
      std::string text = *tok_.decode(g);
      if (size_t at = text.find(from_); at != std::string::npos)
        text.replace(at, from_.size(), to_);
      g = tok_.encode(text, true);
    }
    return got;
  }

 private:
  Generator& inner_;
  const Tokenizer& tok_;
  std::string from_, to_;
};

TEST(TrainerEval, ToolOracleScoresOneMalformedCallsScoreZero) {
  const auto tok = Tokenizer::byte_level();
  for (ChatFormat format : {ChatFormat::kNative, ChatFormat::kQwen, ChatFormat::kKimi}) {
    EvalOptions o;
    o.task = "tool";
    o.samples = 6;
    o.tool.max_turns = 3;
    o.format = format;
    o.syntax = default_tool_call_syntax(format);
    OracleGenerator oracle(tool_examples(o, *tok));
    std::FILE* out = std::tmpfile();
    auto summary = run_eval(o, *tok, oracle, out, nullptr);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(oracle.misses, 0) << chat_format_name(format);
    EXPECT_EQ(summary->score, 1.0) << chat_format_name(format);
    const auto lines = read_lines(out);
    ASSERT_EQ(lines.size(), 7u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(lines[i]["complete"], true);
      EXPECT_EQ(lines[i]["calls_correct"], lines[i]["calls"]);
      EXPECT_GE(lines[i]["calls"].get<int>(), 1);
    }
    EXPECT_EQ(lines[6]["task"], "tool");
    std::fclose(out);
  }
  // Native: a call whose arguments lose their closing brace, or that names another tool, fails
  // its dialogue even though every answer is right.
  EvalOptions o;
  o.task = "tool";
  o.samples = 6;
  for (auto [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"}<|tool_call_end|>", "<|tool_call_end|>"},
                                                        {"<|tool_call|>add", "<|tool_call|>sub"},
                                                        {"<|tool_call|>lookup", "<|tool_call|>add"},
                                                        {"<|tool_args|>", " "}}) {
    OracleGenerator oracle(tool_examples(o, *tok));
    TextEdit broken(oracle, *tok, from, to);
    std::FILE* out = std::tmpfile();
    auto summary = run_eval(o, *tok, broken, out, nullptr);
    ASSERT_TRUE(summary.ok());
    const auto lines = read_lines(out);
    int calls = 0, broken_calls = 0;
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      calls += lines[i]["calls"].get<int>();
      broken_calls += lines[i]["calls"].get<int>() - lines[i]["calls_correct"].get<int>();
      EXPECT_EQ(lines[i]["answers_correct"], lines[i]["answers"]);
    }
    EXPECT_GT(broken_calls, 0) << from;
    if (from.find("lookup") == std::string::npos && from.find("add") == std::string::npos) {
      EXPECT_EQ(broken_calls, calls) << from;  // every call was broken
      EXPECT_EQ(summary->score, 0.0) << from;
    }
    std::fclose(out);
  }
}

TEST(TrainerEval, RefusesBadOptions) {
  EvalOptions o;
  o.task = "needle";
  EXPECT_NE(o.validate().message().find("unknown task"), std::string::npos);
  o.task = "passkey";
  EXPECT_TRUE(o.validate().ok());
  o.depths = {0.5, 1.5};
  EXPECT_NE(o.validate().message().find("--depths"), std::string::npos);
  o = {.task = "passkey", .lengths = {}};
  EXPECT_NE(o.validate().message().find("--lengths"), std::string::npos);
  o = {.task = "mqar", .samples = 0};
  EXPECT_NE(o.validate().message().find("--samples"), std::string::npos);
  // A passkey context too short for the task is an error naming it, not a score.
  const auto tok = Tokenizer::byte_level();
  OracleGenerator none({});
  auto r =
      run_eval({.task = "passkey", .lengths = {40}, .depths = {0.5}}, *tok, none, nullptr, nullptr);
  EXPECT_NE(r.status().message().find("shorter"), std::string::npos);
}

// End to end through Engine on a fixture model (untrained: the scores are whatever they are; the
// lines have the promised shape).
TEST(TrainerEval, RunsThroughTheEngineOnAFixtureModel) {
  const std::string dir = testing::kFixtures + "/fla_kda_s0";
  struct Case {
    EvalOptions o;
    size_t lines;
  };
  const std::vector<Case> cases = {
      {{.task = "passkey", .lengths = {300}, .depths = {0.0, 1.0}, .samples = 1}, 3},
      {{.task = "mqar", .samples = 2, .mqar = {.num_pairs = 4}}, 3},
      {{.task = "tool", .samples = 1}, 2},
  };
  for (const Case& c : cases) {
    std::FILE* out = std::tmpfile();
    auto summary = run_eval_on_model(dir, Device::kCpu, c.o, out, nullptr);
    ASSERT_TRUE(summary.ok()) << c.o.task << ": " << summary.status();
    const auto lines = read_lines(out);
    ASSERT_EQ(lines.size(), c.lines) << c.o.task;
    for (const auto& l : lines) EXPECT_EQ(l["task"], c.o.task);
    EXPECT_TRUE(lines.back().contains("score"));
    EXPECT_GE(summary->score, 0.0);
    EXPECT_LE(summary->score, 1.0);
    EXPECT_EQ(lines.back()["total"], summary->total);
    std::fclose(out);
  }
  auto missing = run_eval_on_model(dir + "/nope", Device::kCpu, {.task = "mqar"}, nullptr, nullptr);
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace loom
