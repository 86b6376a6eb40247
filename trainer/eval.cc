#include "trainer/eval.h"

#include <algorithm>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

void print_line(std::FILE* out, const nlohmann::json& line) {
  if (out != nullptr) std::fprintf(out, "%s\n", line.dump().c_str());
}

// A generator's answer count must match the requests'.
absl::StatusOr<std::vector<std::vector<int32_t>>> generate_checked(
    Generator& generator, const std::vector<GenerationRequest>& requests) {
  auto got = generator.generate(requests);
  if (got.ok() && got->size() != requests.size())
    return absl::InternalError(
        absl::StrCat("eval: ", got->size(), " generations for ", requests.size(), " requests"));
  return got;
}

// The example's prompt (up to and including its first scored position) and the answer tokens
// after it.
std::pair<std::vector<int32_t>, std::vector<int32_t>> split_at_first_scored(const Example& ex) {
  const size_t first =
      std::find(ex.loss_mask.begin(), ex.loss_mask.end(), uint8_t{1}) - ex.loss_mask.begin();
  const size_t cut = std::min(first + 1, ex.tokens.size());
  return {std::vector<int32_t>(ex.tokens.begin(), ex.tokens.begin() + cut),
          std::vector<int32_t>(ex.tokens.begin() + cut, ex.tokens.end())};
}

// Decodes generated ids with special tokens kept; ids the tokenizer does not know (a model
// vocabulary larger than the tokenizer's) read as U+FFFD.
std::string decode_generated(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (auto t = tokenizer.decode(run, /*skip_special=*/false); t.ok()) text += *t;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id >= 0 && id < tokenizer.vocab_size()) {
      run.push_back(id);
    } else {
      flush();
      text += "\xEF\xBF\xBD";
    }
  }
  flush();
  return text;
}

absl::StatusOr<EvalSummary> eval_passkey(const EvalOptions& o, const Tokenizer& tokenizer,
                                         Generator& generator, std::FILE* out, std::FILE* table) {
  EvalSummary summary{.task = "passkey"};
  std::vector<std::vector<double>> recall(o.depths.size(), std::vector<double>(o.lengths.size()));
  for (size_t li = 0; li < o.lengths.size(); ++li) {
    for (size_t di = 0; di < o.depths.size(); ++di) {
      std::vector<GenerationRequest> requests;
      std::vector<std::vector<int32_t>> answers;
      for (int s = 0; s < o.samples; ++s) {
        std::mt19937_64 rng = eval_case_rng(o.seed, "passkey", {li, di, static_cast<uint64_t>(s)});
        auto ex = make_passkey(
            tokenizer,
            {.context_tokens = o.lengths[li], .depth = o.depths[di], .digits = o.passkey_digits},
            rng);
        if (!ex.ok()) return ex.status();
        auto [prompt, answer] = split_at_first_scored(*ex);
        requests.push_back({std::move(prompt), static_cast<int>(answer.size())});
        answers.push_back(std::move(answer));
      }
      auto got = generate_checked(generator, requests);
      if (!got.ok()) return got.status();
      int correct = 0;
      for (size_t s = 0; s < answers.size(); ++s) correct += (*got)[s] == answers[s];
      recall[di][li] = static_cast<double>(correct) / o.samples;
      summary.correct += correct;
      summary.total += o.samples;
      print_line(out, {{"task", "passkey"},
                       {"length", o.lengths[li]},
                       {"depth", o.depths[di]},
                       {"samples", o.samples},
                       {"correct", correct},
                       {"recall", recall[di][li]}});
    }
  }
  if (table != nullptr) {
    std::fprintf(table, "passkey exact recall (rows: needle depth, columns: context tokens)\n");
    std::fprintf(table, "%8s", "depth");
    for (int64_t l : o.lengths) std::fprintf(table, " %8lld", static_cast<long long>(l));
    std::fprintf(table, "\n");
    for (size_t di = 0; di < o.depths.size(); ++di) {
      std::fprintf(table, "%8.2f", o.depths[di]);
      for (double r : recall[di]) std::fprintf(table, " %8.2f", r);
      std::fprintf(table, "\n");
    }
  }
  return summary;
}

// The MQAR examples the evaluation draws. The prompts end at the queries: packed, the padding
// after them changes nothing (the example is 4 num_pairs tokens); spread, the slots depend on the
// length asked for.
MqarOptions eval_mqar_layout(const MqarOptions& m) {
  MqarOptions r = m;
  if (!r.spread) r.seq_len = 4 * r.num_pairs;
  return r;
}

absl::StatusOr<EvalSummary> eval_mqar(const EvalOptions& o, Generator& generator, std::FILE* out) {
  EvalSummary summary{.task = "mqar"};
  const MqarOptions mqar = eval_mqar_layout(o.mqar);
  for (int s = 0; s < o.samples; ++s) {
    std::mt19937_64 rng = eval_case_rng(o.seed, "mqar", {static_cast<uint64_t>(s)});
    const Example ex = make_mqar(mqar, rng);
    std::vector<GenerationRequest> requests;
    std::vector<int32_t> answers;
    for (size_t i = 0; i + 1 < ex.tokens.size(); ++i) {
      if (!ex.loss_mask[i]) continue;
      requests.push_back({std::vector<int32_t>(ex.tokens.begin(), ex.tokens.begin() + i + 1), 1});
      answers.push_back(ex.tokens[i + 1]);
    }
    auto got = generate_checked(generator, requests);
    if (!got.ok()) return got.status();
    int correct = 0;
    for (size_t q = 0; q < answers.size(); ++q)
      correct += !(*got)[q].empty() && (*got)[q][0] == answers[q];
    summary.correct += correct;
    summary.total += static_cast<int64_t>(answers.size());
    print_line(out, {{"task", "mqar"},
                     {"example", s},
                     {"queries", answers.size()},
                     {"correct", correct},
                     {"accuracy", static_cast<double>(correct) / answers.size()}});
  }
  return summary;
}

absl::StatusOr<EvalSummary> eval_tool(const EvalOptions& o, const Tokenizer& tokenizer,
                                      Generator& generator, std::FILE* out) {
  EvalSummary summary{.task = "tool"};
  if (absl::Status st = o.tool.validate(); !st.ok()) return st;
  auto marker = end_of_turn_marker(o.format);
  if (!marker.ok()) return marker.status();
  for (int s = 0; s < o.samples; ++s) {
    std::mt19937_64 rng = eval_case_rng(o.seed, "tool", {static_cast<uint64_t>(s)});
    const ToolDialogue dialogue = make_tool_dialogue(o.tool, rng);
    auto turns = tool_dialogue_turns(o.format, dialogue);
    if (!turns.ok()) return turns.status();
    // Every turn's prompt holds the reference conversation before it (the tool result follows
    // the reference call), so the turns are independent and run as one batch; a dialogue is
    // complete only when its every call and answer is right.
    std::vector<GenerationRequest> requests;
    for (const ToolDialogueTurn& t : *turns) {
      const int reply_tokens = static_cast<int>(tokenizer.encode(t.reply, true).size());
      requests.push_back({encode_chat_prompt(tokenizer, t.prompt), 2 * reply_tokens + 8});
    }
    auto got = generate_checked(generator, requests);
    if (!got.ok()) return got.status();
    int calls = 0, calls_right = 0, answers = 0, answers_right = 0;
    for (size_t k = 0; k < turns->size(); ++k) {
      const ChatMessage& expected = dialogue.messages[(*turns)[k].message];
      const std::string text = decode_generated(tokenizer, (*got)[k]);
      const std::string_view reply = cut_at_marker(text, *marker);
      if (!expected.tool_calls.empty()) {
        ++calls;
        calls_right += tool_call_turn_correct(o.syntax, reply, expected.tool_calls[0]);
      } else {
        ++answers;
        answers_right += answer_turn_correct(o.syntax, reply, expected.content);
      }
    }
    const bool complete = calls_right == calls && answers_right == answers;
    summary.correct += complete;
    summary.total += 1;
    print_line(out, {{"task", "tool"},
                     {"dialogue", s},
                     {"calls", calls},
                     {"calls_correct", calls_right},
                     {"answers", answers},
                     {"answers_correct", answers_right},
                     {"complete", complete}});
  }
  return summary;
}

// Greedy generations through an Engine: every request of a batch is submitted, then each stream
// is drained.
class EngineGenerator : public Generator {
 public:
  explicit EngineGenerator(Engine& engine) : engine_(engine) {}

  absl::StatusOr<std::vector<std::vector<int32_t>>> generate(
      const std::vector<GenerationRequest>& requests) override {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerationRequest& g : requests) {
      Request r;
      r.prompt = g.prompt;
      r.params.temperature = 0.0f;
      r.params.max_tokens = g.max_tokens;
      r.tag = "eval";
      auto stream = engine_.submit(std::move(r));
      if (!stream.ok()) {
        for (auto& st : streams) engine_.cancel(st->id());
        return stream.status();
      }
      streams.push_back(std::move(stream).value());
    }
    std::vector<std::vector<int32_t>> out(requests.size());
    for (size_t i = 0; i < streams.size(); ++i) {
      while (std::optional<RequestOutput> ev = streams[i]->next()) {
        out[i].insert(out[i].end(), ev->token_ids.begin(), ev->token_ids.end());
        if (ev->finish == FinishReason::kError)
          return absl::InternalError(
              absl::StrCat("eval: the engine failed a request: ", ev->error));
      }
    }
    return out;
  }

 private:
  Engine& engine_;
};

}  // namespace

std::mt19937_64 eval_case_rng(uint64_t seed, std::string_view task,
                              std::initializer_list<uint64_t> index) {
  std::vector<uint32_t> words = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (char c : task) words.push_back(static_cast<unsigned char>(c));
  for (uint64_t w : index) words.push_back(static_cast<uint32_t>(w));
  std::seed_seq seq(words.begin(), words.end());
  return std::mt19937_64(seq);
}

absl::Status EvalOptions::validate() const {
  if (task != "passkey" && task != "mqar" && task != "tool")
    return absl::InvalidArgumentError(
        absl::StrCat("--task: unknown task '", task, "' (passkey, mqar or tool)"));
  if (samples < 1)
    return absl::InvalidArgumentError(absl::StrCat("--samples: ", samples, " (at least 1)"));
  if (task == "passkey") {
    if (lengths.empty()) return absl::InvalidArgumentError("--lengths: no context lengths");
    for (int64_t l : lengths)
      if (l < 1) return absl::InvalidArgumentError(absl::StrCat("--lengths: ", l, " (positive)"));
    if (depths.empty()) return absl::InvalidArgumentError("--depths: no needle depths");
    for (double d : depths)
      if (!(d >= 0.0 && d <= 1.0))
        return absl::InvalidArgumentError(absl::StrCat("--depths: ", d, " outside [0, 1]"));
  }
  if (task == "mqar") {
    if (absl::Status st = eval_mqar_layout(mqar).validate(); !st.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--mqar_pairs / --mqar_seq_len: ", st.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalSummary> run_eval(const EvalOptions& options, const Tokenizer& tokenizer,
                                     Generator& generator, std::FILE* out, std::FILE* table) {
  if (absl::Status st = options.validate(); !st.ok()) return st;
  absl::StatusOr<EvalSummary> summary;
  if (options.task == "passkey") {
    summary = eval_passkey(options, tokenizer, generator, out, table);
  } else if (options.task == "mqar") {
    summary = eval_mqar(options, generator, out);
  } else {
    summary = eval_tool(options, tokenizer, generator, out);
  }
  if (!summary.ok()) return summary.status();
  summary->score =
      summary->total > 0 ? static_cast<double>(summary->correct) / summary->total : 0.0;
  print_line(out, {{"task", summary->task},
                   {"score", summary->score},
                   {"correct", summary->correct},
                   {"total", summary->total}});
  return summary;
}

absl::StatusOr<EvalSummary> run_eval_on_model(const std::string& model_dir, Device device,
                                              EvalOptions options, std::FILE* out,
                                              std::FILE* table) {
  if (absl::Status st = options.validate(); !st.ok()) return st;
  if (absl::Status st = device_available(device); !st.ok()) return st;
  auto model = Model::load(model_dir, Placement{.device = device});
  if (!model.ok()) return model.status();
  std::shared_ptr<const Tokenizer> tokenizer;
  if (!Tokenizer::format_in_dir(model_dir).empty()) {
    auto t = Tokenizer::from_dir(model_dir);
    if (!t.ok()) return t.status();
    tokenizer = std::move(t).value();
  } else {
    tokenizer = Tokenizer::byte_level();  // as loom-server does for small bundled models
  }
  const ModelConfig& cfg = (*model)->config();
  if (options.task != "mqar" && tokenizer->vocab_size() > cfg.vocab_size)
    return absl::InvalidArgumentError(
        absl::StrCat("eval: the tokenizer's ", tokenizer->vocab_size(),
                     " ids do not fit the model's vocabulary of ", cfg.vocab_size));
  options.format = chat_format_for_model_type(cfg.model_type);
  options.syntax = default_tool_call_syntax(options.format);
  auto engine = Engine::create(std::move(model).value(), tokenizer, EngineOptions{});
  if (!engine.ok()) return engine.status();
  EngineGenerator generator(**engine);
  auto summary = run_eval(options, *tokenizer, generator, out, table);
  (*engine)->shutdown();
  return summary;
}

}  // namespace loom
