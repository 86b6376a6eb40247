// Host time of a kept conversation's next turn before the model runs: rendering the chat template
// and tokenizing, at a long history (issue 18: a turn must not re-tokenize its history).
//
// Builds a conversation of `--turns` user/assistant turns of random words, code and numbers until
// its encoding reaches `--history_tokens`, as the server keeps it (the ids of each prompt and of
// each reply as sampled: server/conversation_tokens.h), then times one more turn (a user message
// of `--new_tokens` tokens) three ways, each the median of `--reps` runs:
//   render       the chat template over the whole conversation alone;
//   whole        prepare_chat encoding the whole rendering (what every turn did before);
//   continued    prepare_chat with the kept ids, encoding only the new text (what a turn does now).
// and, before rendering, the request: the whole conversation as one body, written and parsed
// (a session turn before its messages were kept parsed; a client re-sending its history), against
// a session turn parsing only its new message with the kept history in place.
// One line per template and tokenizer: the fixture Jinja templates with the fixture tokenizers,
// and the built-in Kimi template with the byte-level tokenizer (the CPU fixture models').
//
//   loom-bench-session-prompt --fixtures /work/shared/fixtures
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "server/chat_history.h"
#include "server/chat_request.h"
#include "server/chat_session.h"
#include "server/chat_setup.h"
#include "server/conversation_tokens.h"
#include "server/openai_request.h"

ABSL_FLAG(std::string, fixtures, "", "the fixtures folder (chat_templates/, tokenizer_*/)");
ABSL_FLAG(int64_t, history_tokens, 65536, "tokens of history before the timed turn");
ABSL_FLAG(int32_t, turns, 30, "turns the history is spread over");
ABSL_FLAG(int32_t, new_tokens, 200, "about how many tokens the timed turn's message has");
ABSL_FLAG(int32_t, reps, 7, "runs per measurement (the median is printed)");

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string random_words(std::mt19937_64& rng, size_t bytes) {
  static const char* const words[] = {
      "the",       "model", "returns", "a",    "list", "of",      "files",  "in",
      "directory", "error", "=",       "{",    "}",    "(",       ")",      "if",
      "for",       "while", "0",       "42",   "3.14", "\"key\"", ":",      "value",
      "\n",        "    ",  "def",     "int",  "std",  "::",      "vector", "<",
      ">",         ";",     "//",      "TODO", "中文", "naïve",   "🙂",   "path/to/file.cc",
      "line",      "12",    "warning", "tool"};
  std::uniform_int_distribution<size_t> pick(0, std::size(words) - 1);
  std::string s;
  while (s.size() < bytes) {
    // One word in four is new (an identifier, a hash, a number), as in tool output, so the
    // tokenizer's word cache does not hold every word of the history.
    if (rng() % 4 == 0) {
      const int len = 3 + static_cast<int>(rng() % 9);
      for (int i = 0; i < len; ++i) s += static_cast<char>((rng() % 2 ? 'a' : '0') + rng() % 10);
    } else {
      s += words[pick(rng)];
    }
    if (rng() % 3 != 0) s += ' ';
  }
  return s;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <class F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `fresh`: a new instance of the tokenizer (an empty word cache).
int run(const std::string& name, const std::function<std::unique_ptr<Tokenizer>()>& fresh,
        const ChatSetup& chat, const std::string& end_turn) {
  const std::unique_ptr<Tokenizer> tokenizer = fresh();
  const Tokenizer& tok = *tokenizer;
  std::mt19937_64 rng(7);
  const int64_t target = absl::GetFlag(FLAGS_history_tokens);
  const int32_t turns = absl::GetFlag(FLAGS_turns);
  const int32_t reps = absl::GetFlag(FLAGS_reps);
  const std::optional<int32_t> end_id = tok.token_id(end_turn);
  if (!end_id) {
    std::fprintf(stderr, "%s: the tokenizer has no %s\n", name.c_str(), end_turn.c_str());
    return 1;
  }
  // Bytes per token of this text, to size the messages.
  const std::string sample = random_words(rng, 20000);
  const double bytes_per_token =
      static_cast<double>(sample.size()) / static_cast<double>(tok.encode(sample, false).size());
  const size_t turn_bytes =
      static_cast<size_t>(bytes_per_token * static_cast<double>(target) / (2.0 * turns));
  ojson messages = ojson::array();
  messages.push_back({{"role", "system"}, {"content", "You are a coding agent."}});
  std::shared_ptr<const ConversationTokens> kept;
  // The conversation as a session keeps it: each message parsed once when it came in.
  std::shared_ptr<const ChatHistory> history;
  auto keep = [&](const ojson& m) {
    history =
        ChatHistory::append(history, ojson::array({m}), {*parse_chat_message(m, "messages[0]")});
  };
  keep(messages[0]);
  auto request_of = [&](const ojson& m) {
    auto req = parse_chat_request(ojson({{"model", "m"}, {"messages", m}}).dump());
    if (!req.ok()) std::fprintf(stderr, "%s\n", std::string(req.status().message()).c_str());
    return *std::move(req);
  };
  while (!kept || static_cast<int64_t>(kept->tokens.size()) < target) {
    messages.push_back({{"role", "user"}, {"content", random_words(rng, turn_bytes)}});
    keep(messages.back());
    auto turn = prepare_chat(request_of(messages), tok, chat, 0, kept.get(), true);
    if (!turn.ok()) {
      std::fprintf(stderr, "%s\n", std::string(turn.status().message()).c_str());
      return 1;
    }
    const std::string reply = random_words(rng, turn_bytes);
    std::vector<int32_t> ids = tok.encode(reply, false);
    ids.push_back(*end_id);
    kept = std::make_shared<const ConversationTokens>(
        *conversation_after_reply(*turn->prompt, ids, tok));
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    keep(messages.back());
  }
  messages.push_back(
      {{"role", "user"},
       {"content", random_words(rng, static_cast<size_t>(bytes_per_token *
                                                         absl::GetFlag(FLAGS_new_tokens)))}});
  // The steps before rendering. Whole: the history and the new message as one request body,
  // written and parsed (what a session turn did before it kept its messages parsed, and what a
  // client that re-sends the history costs each turn). Session: only the new message's body,
  // parsed with the kept history in place (server/chat_history.h), and the turn's new messages
  // taken for the store (ConversationTurn::take_new_messages).
  const std::string body = ojson({{"model", "m"}, {"messages", messages}}).dump();
  const double write_whole = median_ms(reps, [&] {
    (void)ojson({{"model", "m"}, {"messages", messages}}).dump();
  });
  const double parse = median_ms(reps, [&] { (void)parse_chat_request(body); });
  const std::string new_body =
      ojson({{"model", "m"}, {"messages", ojson::array({messages.back()})}}).dump();
  size_t session_messages = 0;
  const double parse_session = median_ms(reps, [&] {
    auto r = parse_chat_request(new_body, history.get(), 0);
    ConversationTurn t;
    t.history = history;
    t.take_new_messages(*r, 0);
    session_messages = r->messages.size();
  });
  if (session_messages != messages.size()) {
    std::fprintf(stderr, "%s: the session turn has %zu messages, the conversation %zu\n",
                 name.c_str(), session_messages, messages.size());
    return 1;
  }
  const OpenAiRequest req = request_of(messages);
  size_t whole_bytes = 0, continued_bytes = 0, prompt_tokens = 0;
  bool continued = false;
  const double render = median_ms(
      reps, [&] { (void)render_chat_request(req, chat.format, chat.chat_template.get()); });
  // The first encoding of the history (a cold word cache: a server whose cache another
  // conversation filled), then the median with this conversation's words cached.
  const std::unique_ptr<Tokenizer> cold_tok = fresh();
  const auto t0 = Clock::now();
  (void)prepare_chat(req, *cold_tok, chat, 0);
  const double whole_cold = ms_since(t0);
  const double whole = median_ms(reps, [&] {
    auto p = prepare_chat(req, tok, chat, 0);
    whole_bytes = p->encoded_bytes;
  });
  const double cont = median_ms(reps, [&] {
    auto p = prepare_chat(req, tok, chat, 0, kept.get(), true);
    continued_bytes = p->encoded_bytes;
    continued = p->continued;
    prompt_tokens = p->request.prompt.size();
  });
  std::printf("| %s | %zu | %zu | %.2f | %.2f | %.3f | %.2f | %.1f | %.1f | %.2f | %zu | %zu |%s\n",
              name.c_str(), kept->tokens.size(), prompt_tokens, write_whole, parse, parse_session,
              render, whole_cold, whole, cont, whole_bytes, continued_bytes,
              continued ? "" : " (not continued)");
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_fixtures);
  if (dir.empty()) {
    std::fprintf(stderr, "--fixtures is required\n");
    return 2;
  }
  std::printf(
      "| template, tokenizer | history tokens | prompt tokens | write whole body ms | "
      "parse whole body ms | parse session turn ms | render ms | "
      "render + tokenize whole ms, cold cache | warm | render + tokenize new ms | "
      "bytes tokenized whole | bytes tokenized new |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  struct Case {
    const char* name;
    const char* templ;
    loom::ChatFormat format;
    const char* tokenizer;
  };
  for (const Case& c :
       {Case{"qwen3_next, tokenizer_qwen", "qwen3_next", loom::ChatFormat::kQwen, "tokenizer_qwen"},
        Case{"kimi_k2, tokenizer_tiktoken_kimi", "kimi_k2", loom::ChatFormat::kKimi,
             "tokenizer_tiktoken_kimi"},
        Case{"built-in kimi, byte-level", "", loom::ChatFormat::kKimi, ""}}) {
    const std::string tokenizer_dir = dir + "/" + c.tokenizer;
    const bool bytes = c.tokenizer[0] == '\0';
    const auto fresh = [&]() -> std::unique_ptr<loom::Tokenizer> {
      if (bytes) return loom::Tokenizer::byte_level();
      auto t = loom::Tokenizer::from_dir(tokenizer_dir);
      if (!t.ok()) {
        std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
        std::exit(1);
      }
      return *std::move(t);
    };
    loom::ChatSetup chat;
    chat.format = c.format;
    if (c.templ[0] != '\0') {
      auto t = loom::CheckpointChatTemplate::load(dir + "/chat_templates/" + c.templ);
      if (!t.ok()) return 1;
      chat.chat_template = std::make_shared<const loom::CheckpointChatTemplate>(*std::move(t));
    }
    rc |= loom::run(c.name, fresh, chat, "<|im_end|>");
  }
  return rc;
}
