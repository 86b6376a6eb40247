// A kept conversation's turn parses only its new messages (server/chat_history.h): over random
// multi-turn conversations it must give exactly what parsing the whole conversation as one
// request body gives (the oracle: parse_chat_request of the body the route built before, history
// serialized into it), in the converted messages, the template's view, the rendered prompt and
// the errors, with and without instructions before the history, with replies that are not valid
// UTF-8, and for a conversation forked from an earlier response.
#include "server/chat_history.h"

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/chat_session.h"
#include "server/openai_request.h"
#include "server/response_store.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

std::string fixture(const std::string& name) { return std::string(LOOM_FIXTURES_DIR) + "/" + name; }

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string random_text(std::mt19937_64& rng) {
  static const char* const pieces[] = {"hello", " world", "\n",   "123", "{\"a\": 1}", "é",
                                       "中文",  "🙂",   "  x ", "\t",  "<|im_end|>", "\\"};
  std::string s;
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) s += pieces[rng() % std::size(pieces)];
  return s;
}

// `fields` as one object, keys in a random order (a template sees the client's order).
ojson shuffled(std::mt19937_64& rng, std::vector<std::pair<std::string, ojson>> fields) {
  std::shuffle(fields.begin(), fields.end(), rng);
  ojson o = ojson::object();
  for (auto& [k, v] : fields) o[k] = std::move(v);
  return o;
}

ojson random_content(std::mt19937_64& rng) {
  if (rng() % 4 != 0) return random_text(rng);
  ojson parts = ojson::array();
  for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i)
    parts.push_back(shuffled(rng, {{"type", "text"}, {"text", random_text(rng)}}));
  return parts;
}

// A turn's new messages as a client sends them: users, tool results, now and then a system
// message; `calls` is the number of tool calls the previous reply made.
ojson new_messages(std::mt19937_64& rng, int calls) {
  ojson out = ojson::array();
  for (int c = 0; c < calls; ++c) {
    std::vector<std::pair<std::string, ojson>> f = {{"role", "tool"},
                                                    {"tool_call_id", absl::StrCat("call_", c)},
                                                    {"content", random_content(rng)}};
    if (rng() % 3 == 0) f.push_back({"name", "get_weather"});
    out.push_back(shuffled(rng, std::move(f)));
  }
  if (rng() % 5 == 0) out.push_back({{"role", "system"}, {"content", random_text(rng)}});
  if (calls == 0 || rng() % 2)
    out.push_back(shuffled(
        rng, {{"role", rng() % 7 == 0 ? "developer" : "user"}, {"content", random_content(rng)}}));
  return out;
}

// A reply as ReplyTranscript builds it: text (sometimes cut inside a UTF-8 character), reasoning,
// tool calls.
ojson random_reply(std::mt19937_64& rng, int* calls) {
  std::string content = random_text(rng);
  if (rng() % 4 == 0) content += "\xe4\xb8";  // the first bytes of a 3-byte character
  std::string reasoning = rng() % 3 == 0 ? random_text(rng) : "";
  ojson tool_calls = ojson::array();
  *calls = static_cast<int>(rng() % 3);
  for (int c = 0; c < *calls; ++c)
    tool_calls.push_back(
        {{"id", absl::StrCat("call_", c)},
         {"type", "function"},
         {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"x\"}"}}}});
  return assistant_message(content, reasoning, std::move(tool_calls));
}

const ojson kTools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather of a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

// The chat body of a turn: instructions, `history`, `messages` (responses_chat_body's layout).
std::string body_of(const std::optional<std::string>& instructions, const ojson& history,
                    const ojson& messages) {
  ojson all = ojson::array();
  if (instructions) all.push_back({{"role", "system"}, {"content", *instructions}});
  for (const ojson& m : history) all.push_back(m);
  for (const ojson& m : messages) all.push_back(m);
  return dump(ojson{{"model", "m"}, {"messages", all}, {"tools", kTools}, {"max_tokens", 8}});
}

void expect_same(const OpenAiRequest& got, const OpenAiRequest& want) {
  ASSERT_EQ(got.messages.size(), want.messages.size());
  for (size_t i = 0; i < want.messages.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "message " << i);
    const ChatMessage &g = got.messages[i], &w = want.messages[i];
    EXPECT_EQ(g.role, w.role);
    EXPECT_EQ(g.content, w.content);
    EXPECT_EQ(g.name, w.name);
    EXPECT_EQ(g.tool_call_id, w.tool_call_id);
    ASSERT_EQ(g.tool_calls.size(), w.tool_calls.size());
    for (size_t k = 0; k < w.tool_calls.size(); ++k) {
      EXPECT_EQ(g.tool_calls[k].id, w.tool_calls[k].id);
      EXPECT_EQ(g.tool_calls[k].name, w.tool_calls[k].name);
      EXPECT_EQ(g.tool_calls[k].arguments_json, w.tool_calls[k].arguments_json);
    }
  }
  // Ordered JSON compares keys in order: the template sees the same objects, keys as written.
  EXPECT_EQ(got.template_messages, want.template_messages);
  EXPECT_EQ(got.template_tools, want.template_tools);
  ASSERT_EQ(got.tools.size(), want.tools.size());
  for (size_t i = 0; i < want.tools.size(); ++i)
    EXPECT_EQ(got.tools[i].parameters_json, want.tools[i].parameters_json);
  EXPECT_EQ(got.params.max_tokens, want.params.max_tokens);
  EXPECT_EQ(got.max_tokens, want.max_tokens);
}

class ChatHistoryTest : public ::testing::TestWithParam<uint64_t> {};

// Conversations kept the way both frontends keep them (ConversationTurn: take_new_messages, then
// record into a ResponseStore), each turn parsed with the stored history against the oracle.
TEST_P(ChatHistoryTest, TurnsEqualParsingTheWholeConversation) {
  const uint64_t seed = GetParam();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto kimi = CheckpointChatTemplate::load(fixture("chat_templates/kimi_k2"));
  ASSERT_TRUE(kimi.ok()) << kimi.status();
  auto store = std::make_shared<ResponseStore>(1000, absl::Hours(1));
  for (int conv = 0; conv < 6; ++conv) {
    ojson oracle_history = ojson::array();  // as the route kept it before: raw messages
    std::shared_ptr<const ChatHistory> history;
    std::string previous;
    std::map<std::string, ojson> oracle_of;  // a response's conversation, for forks
    int calls = 0;
    for (int turn = 0; turn < 8; ++turn) {
      SCOPED_TRACE(testing::Message() << "conversation " << conv << " turn " << turn);
      const std::optional<std::string> instructions =
          rng() % 3 == 0 ? std::optional<std::string>(random_text(rng)) : std::nullopt;
      // gRPC may send a turn without messages; a first turn needs one.
      ojson messages =
          turn > 0 && calls == 0 && rng() % 8 == 0 ? ojson::array() : new_messages(rng, calls);
      const size_t at = instructions ? 1 : 0;
      absl::StatusOr<OpenAiRequest> want =
          parse_chat_request(body_of(instructions, oracle_history, messages));
      absl::StatusOr<OpenAiRequest> got =
          parse_chat_request(body_of(instructions, ojson::array(), messages), history.get(), at);
      ASSERT_EQ(got.ok(), want.ok()) << got.status() << " vs " << want.status();
      if (!want.ok()) {
        EXPECT_EQ(got.status(), want.status());
        continue;
      }
      expect_same(*got, *want);
      for (ChatFormat f : {ChatFormat::kKimi, ChatFormat::kQwen}) {
        auto g = render_chat_request(*got, f, nullptr), w = render_chat_request(*want, f, nullptr);
        ASSERT_TRUE(g.ok() && w.ok()) << g.status() << w.status();
        EXPECT_EQ(g->text, w->text);
      }
      auto g = render_chat_request(*got, ChatFormat::kKimi, &*kimi);
      auto w = render_chat_request(*want, ChatFormat::kKimi, &*kimi);
      ASSERT_TRUE(g.ok() && w.ok()) << g.status() << w.status();
      EXPECT_EQ(g->text, w->text);
      EXPECT_EQ(g->markup_ranges, w->markup_ranges);

      ConversationTurn kept;
      kept.store = store;
      kept.key = absl::StrCat("c", conv, "t", turn);
      kept.session = absl::StrCat("c", conv);
      kept.history = history;
      kept.take_new_messages(*got, at);
      ASSERT_EQ(kept.new_template_messages, messages);
      const ojson reply = random_reply(rng, &calls);
      kept.record(reply, {}, "");
      for (const ojson& m : messages) oracle_history.push_back(m);
      oracle_history.push_back(reply);
      oracle_of[kept.key] = oracle_history;
      std::optional<ResponseStore::Entry> entry = store->get(kept.key, absl::Now());
      ASSERT_TRUE(entry.has_value());
      ASSERT_EQ(entry->messages->size(), oracle_history.size());
      // A fork: now and then the next turn continues an earlier response instead.
      if (turn > 1 && rng() % 4 == 0) {
        entry = store->get(previous, absl::Now());  // the response before this one
        ASSERT_TRUE(entry.has_value());
        oracle_history = oracle_of[previous];
        ASSERT_EQ(entry->messages->size(), oracle_history.size());
        calls = 0;  // the reply of `previous` may have made calls; send a user message only
      }
      previous = kept.key;
      history = entry->messages;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, ChatHistoryTest, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

// A bad new message is refused with the words and the index the whole body gives (it counts the
// history), instructions first or not; an empty turn needs a history.
TEST(ChatHistory, ErrorsNameTheMessageAsTheWholeBodyDoes) {
  const ojson stored = ojson::parse(R"([{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "yo", "tool_calls": [{"id": "call_0", "type": "function",
       "function": {"name": "get_weather", "arguments": "{}"}}]}])");
  std::vector<ChatMessage> converted;
  for (size_t i = 0; i < stored.size(); ++i)
    converted.push_back(*parse_chat_message(stored[i], absl::StrCat("messages[", i, "]")));
  const auto history = ChatHistory::append(nullptr, stored, converted);
  const char* const bad[] = {
      R"([{"role": "tool", "content": "x"}])",
      R"([{"role": "user", "content": "ok"}, {"role": "wizard", "content": "x"}])",
      R"([{"role": "user", "content": "ok"}, {"role": "user", "content": 5}])",
      R"([{"role": "user", "zeta": 1, "alpha": 2, "content": "x"}])",
      R"([{"role": "assistant", "refusal": "no"}])",
      R"([{"role": "user", "content": [{"type": "image_url"}]}])",
      R"([{"role": "user", "content": "x"}, 7])",
      R"("not a list")",
      R"([])"};
  for (const char* b : bad) {
    for (const std::optional<std::string>& instructions :
         {std::optional<std::string>(), std::optional<std::string>("be brief")}) {
      SCOPED_TRACE(testing::Message() << b << (instructions ? " with instructions" : ""));
      const ojson messages = ojson::parse(b);
      auto body = [&](const ojson& h) {
        ojson all = ojson::array();
        if (instructions) all.push_back({{"role", "system"}, {"content", *instructions}});
        for (const ojson& m : h) all.push_back(m);
        if (!messages.is_array()) return dump(ojson{{"messages", messages}});
        for (const ojson& m : messages) all.push_back(m);
        return dump(ojson{{"messages", all}});
      };
      const auto want = parse_chat_request(body(stored));
      const auto got =
          parse_chat_request(body(ojson::array()), history.get(), instructions ? 1 : 0);
      EXPECT_EQ(got.status(), want.status());
      if (want.ok()) expect_same(*got, *want);
    }
  }
  // Without a history an empty list is refused, as before.
  EXPECT_FALSE(parse_chat_request(R"({"messages": []})", nullptr, 0).ok());
}

// One parse of the body keeps what the sorted parse gave where key order shows: the first
// unknown key in sorted order is named, logit_bias in key order, the tools' schemas with sorted
// keys for the built-in templates (the oracle: nlohmann::json, which sorts).
TEST(ChatHistory, OneOrderedParseKeepsSortedBehaviour) {
  auto r = parse_chat_request(R"({"zeta": 1, "messages": [{"role": "user", "content": "x"}],
                                  "beta": 2, "alpha": 3})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "Unrecognized request argument supplied: alpha");
  const std::string tools = R"([{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"z": {"type": "string"},
      "a": {"type": "number"}}}}}])";
  r = parse_chat_request(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
      "logit_bias": {"9": 1, "10": -2, "100": 3}, "tools": )",
                                      tools, "}"));
  ASSERT_TRUE(r.ok()) << r.status();
  const nlohmann::json sorted_bias = nlohmann::json::parse(R"({"9": 1, "10": -2, "100": 3})");
  ASSERT_EQ(r->params.logit_bias.size(), 3u);
  size_t i = 0;
  for (const auto& [key, bias] : sorted_bias.items()) {
    EXPECT_EQ(r->params.logit_bias[i].first, std::stoi(key));
    EXPECT_EQ(r->params.logit_bias[i].second, bias.get<float>());
    ++i;
  }
  const nlohmann::json sorted_tools = nlohmann::json::parse(tools);
  EXPECT_EQ(r->tools[0].parameters_json, sorted_tools[0]["function"]["parameters"].dump());
  // The template still sees the client's order.
  EXPECT_EQ(r->template_tools, ojson::parse(tools));
}

// A conversation of many turns is freed without one stack frame per turn.
TEST(ChatHistory, LongChainsFreeIteratively) {
  std::shared_ptr<const ChatHistory> h;
  ChatMessage m;
  m.role = "user";
  for (int i = 0; i < 300000; ++i)
    h = ChatHistory::append(std::move(h), ojson::array({{{"role", "user"}}}), {m});
  EXPECT_EQ(h->size(), 300000u);
  std::shared_ptr<const ChatHistory> fork = ChatHistory::append(h, ojson::array(), {});
  h.reset();
  EXPECT_EQ(fork->size(), 300000u);
  fork.reset();
}

}  // namespace
}  // namespace loom
