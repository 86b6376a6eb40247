// Every conversation of ../shared/fixtures/chat_templates/<name>/cases.json (real checkpoint
// templates rendered by transformers 5.17 / jinja2 3.1.6, see the fixtures README) rendered by
// Loom's Jinja interpreter through CheckpointChatTemplate, byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/chat/checkpoint_chat_template.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using json = nlohmann::ordered_json;

const std::filesystem::path kDir = std::filesystem::path(LOOM_FIXTURES_DIR) / "chat_templates";

json read_cases(const std::string& name) {
  std::ifstream in(kDir / name / "cases.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

ChatTemplateInput input_of(const json& c) {
  ChatTemplateInput in;
  in.messages = c["messages"];
  in.tools = c["tools"];
  in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  in.kwargs = c["kwargs"];
  return in;
}

class ChatTemplateFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixtures, EveryCaseByteForByte) {
  const std::string name = GetParam();
  ASSERT_TRUE(std::filesystem::exists(kDir / name)) << kDir / name;
  auto t = CheckpointChatTemplate::load(kDir / name);
  ASSERT_TRUE(t.ok()) << t.status();
  const json cases = read_cases(name);
  EXPECT_EQ(t->sorts_tool_keys(), cases["tool_preprocess"] == "deep_sort_dict");
  // The variables loaded from tokenizer_config.json are those the reference renderer received.
  const json& vars = cases["variables"];
  EXPECT_EQ(t->variables().items.size(), vars.size());
  for (const auto& [k, v] : vars.items()) {
    const jinja::Value* got = t->variables().find(k);
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(got->s, v.get<std::string>()) << k;
  }
  int passed = 0;
  for (const json& c : cases["cases"]) {
    const std::string case_name = c["name"].get<std::string>();
    SCOPED_TRACE(name + "/" + case_name);
    const ChatTemplateInput in = input_of(c);
    auto got = t->render(in);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, c["expected"].get<std::string>());
    if (c.contains("apply_chat_template_error")) {
      auto applied = t->apply(in);
      ASSERT_FALSE(applied.ok());
      EXPECT_NE(applied.status().message().find("empty conversation"), std::string::npos)
          << applied.status();
    } else {
      auto applied = t->apply(in);
      ASSERT_TRUE(applied.ok()) << applied.status();
      EXPECT_EQ(*applied, *got);
    }
    passed += *got == c["expected"].get<std::string>();
    if (c.contains("apply_chat_template_error")) continue;
    // The prompt form: the same text, and markup ranges that leave out every message content the
    // template printed verbatim (so request text cannot spell special tokens).
    auto prompt = t->apply_prompt(in);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(prompt->text, *got);
    size_t end = 0;
    for (const auto& [b, e] : prompt->markup_ranges) {
      EXPECT_LE(end, b);
      EXPECT_LT(b, e);
      end = e;
    }
    EXPECT_LE(end, prompt->text.size());
    auto in_markup = [&](size_t pos) {
      for (const auto& [b, e] : prompt->markup_ranges) {
        if (pos >= b && pos < e) return true;
      }
      return false;
    };
    for (const json& m : c["messages"]) {
      if (!m.contains("content") || !m["content"].is_string()) continue;
      const std::string content = m["content"].get<std::string>();
      if (content.empty()) continue;
      bool verbatim_outside = false;
      bool occurs = false;
      for (size_t at = got->find(content); at != std::string::npos;
           at = got->find(content, at + 1)) {
        occurs = true;
        bool outside = true;
        for (size_t k = at; k < at + content.size() && outside; ++k) outside = !in_markup(k);
        verbatim_outside = verbatim_outside || outside;
      }
      if (occurs) EXPECT_TRUE(verbatim_outside) << "content inside markup: " << content;
    }
  }
  RecordProperty("passed", passed);
  std::printf("%s: %d of %zu cases pass\n", name.c_str(), passed, cases["cases"].size());
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplateFixtures,
                         ::testing::Values("kimi_k2", "kimi_k2_thinking", "kimi_k2_5",
                                           "deepseek_v3", "deepseek_v3_1", "qwen3_next"));

}  // namespace
}  // namespace loom
