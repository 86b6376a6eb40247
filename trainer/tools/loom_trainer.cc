// loom-trainer: the training side of Loom (docs/trainer.md).
//
//   loom-trainer prepare-data --tokenizer PATH --out FILE [--split file|paragraph] INPUT...
//       tokenizes text files into one token shard (trainer/token_shard.h) and prints a JSON line
//       with the counts.
//   loom-trainer shard-info FILE
//       validates a shard and prints its counts as one JSON line.
//   loom-trainer train --config RUN.json
//       trains as the run config says (docs/trainer.md): metrics.jsonl, progress on stderr,
//       checkpoints in the run folder.
//   loom-trainer rl --config RL.json
//       agent RL with GRPO (trainer/rl/rl_run.h, docs/trainer.md): rollouts through an
//       in-process engine, updates, weight sync; metrics.jsonl and checkpoints in the run folder,
//       a line per step on stderr, then {"steps", "first_reward", "last_reward", ...}.
//   loom-trainer gradcheck --fixture DIR [--device cpu|cuda]
//       the loss and every parameter's gradient on the fixture's prompt 1 against its
//       grads.safetensors and loss_1: one JSON line per tensor, then {"fixture", "ok", ...}.
//   loom-trainer eval --model DIR --task passkey|mqar|tool [--lengths 512,1024] [--depths 0,0.5,1]
//                     [--samples N] [--seed S] [--device cpu|cuda] [--mqar_pairs N]
//                     [--mqar_seq_len N]
//       greedy evaluation through the serving engine (trainer/eval.h): one JSON line per grid
//       cell / example / dialogue, then {"task", "score", ...}; bad flags exit 2.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"
#include "trainer/eval.h"
#include "trainer/gradcheck.h"
#include "trainer/prepare_data.h"
#include "trainer/rl/rl_run.h"
#include "trainer/run_config.h"
#include "trainer/token_shard.h"
#include "trainer/train_run.h"

ABSL_FLAG(std::string, tokenizer, "",
          "prepare-data: a tokenizer.json, a model folder, or 'byte' (the byte-level tokenizer)");
ABSL_FLAG(std::string, out, "", "prepare-data: the shard to write");
ABSL_FLAG(std::string, split, "file",
          "prepare-data: 'file' (one document per input) or 'paragraph' (blank lines separate "
          "documents)");

ABSL_FLAG(std::string, config, "", "train, rl: the run config (RUN.json, RL.json)");
ABSL_FLAG(std::string, fixture, "", "gradcheck: the fixture folder (with grads.safetensors)");
ABSL_FLAG(std::string, device, "cpu",
          "gradcheck and eval: cpu, cuda or cuda:N (train: the run config's \"device\")");
ABSL_FLAG(double, max_rel_l2, 1e-3,
          "gradcheck: the per-tensor relative L2 bound (docs/trainer.md: why 1e-3 in f32)");

ABSL_FLAG(std::string, model, "", "eval: the model folder");
ABSL_FLAG(std::string, task, "", "eval: passkey, mqar or tool");
ABSL_FLAG(std::string, lengths, "512,1024,2048", "eval passkey: context lengths in tokens");
ABSL_FLAG(std::string, depths, "0,0.25,0.5,0.75,1", "eval passkey: needle depths in [0, 1]");
ABSL_FLAG(int, samples, 4, "eval: samples per passkey cell, MQAR examples, or tool dialogues");
ABSL_FLAG(uint64_t, seed, 1, "eval: seeds the prompts");
ABSL_FLAG(int, mqar_pairs, 0, "eval mqar: key-value pairs per example (0: 16)");
ABSL_FLAG(int, mqar_seq_len, 0,
          "eval mqar: 0 puts the queries right after the pairs; N spreads them over N tokens "
          "(data.mqar.spread)");

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "loom-trainer: %s\n", message.c_str());
  return 1;
}

int prepare_data(const std::vector<std::string>& inputs) {
  const std::string path = absl::GetFlag(FLAGS_tokenizer), out = absl::GetFlag(FLAGS_out);
  const std::string split = absl::GetFlag(FLAGS_split);
  if (path.empty() || out.empty()) return fail("prepare-data needs --tokenizer and --out");
  if (split != "file" && split != "paragraph")
    return fail("--split must be 'file' or 'paragraph', not '" + split + "'");
  std::unique_ptr<loom::Tokenizer> tokenizer;
  if (path == "byte") {
    tokenizer = loom::Tokenizer::byte_level();
  } else {
    std::error_code ec;
    auto loaded = std::filesystem::is_directory(path, ec) ? loom::Tokenizer::from_dir(path)
                                                          : loom::Tokenizer::from_file(path);
    if (!loaded.ok()) return fail(std::string(loaded.status().message()));
    tokenizer = std::move(*loaded);
  }
  auto stats = loom::prepare_token_shard(
      *tokenizer, inputs,
      split == "file" ? loom::DocumentSplit::kFile : loom::DocumentSplit::kParagraph, out);
  if (!stats.ok()) return fail(std::string(stats.status().message()));
  nlohmann::json line = {{"shard", out},
                         {"files", stats->files},
                         {"documents", stats->documents},
                         {"tokens", stats->tokens},
                         {"bytes", stats->bytes}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

int shard_info(const std::vector<std::string>& args) {
  if (args.size() != 1) return fail("shard-info takes one shard file");
  auto shard = loom::TokenShard::open(args[0]);
  if (!shard.ok()) return fail(std::string(shard.status().message()));
  nlohmann::json line = {{"shard", args[0]},
                         {"documents", shard->num_docs()},
                         {"tokens", shard->num_tokens()},
                         {"token_bytes", shard->token_bytes()},
                         {"max_token", shard->max_token()}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

int gradcheck() {
  const std::string fixture = absl::GetFlag(FLAGS_fixture);
  if (fixture.empty()) return fail("gradcheck needs --fixture DIR");
  auto device = loom::parse_device(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return fail("gradcheck --device: " + std::string(device.status().message()));
  auto report = loom::gradcheck_fixture(fixture, *device);
  if (!report.ok()) return fail(std::string(report.status().message()));
  const double bound = absl::GetFlag(FLAGS_max_rel_l2);
  double worst = 0;
  bool ok = std::fabs(report->loss - report->ref_loss) <= 1e-5 * std::fabs(report->ref_loss);
  for (const loom::GradcheckTensor& t : report->tensors) {
    const bool pass = t.rel_l2 <= bound;
    ok &= pass;
    worst = std::max(worst, t.rel_l2);
    nlohmann::json line = {{"tensor", t.name},
                           {"rel_l2", t.rel_l2},
                           {"max_abs", t.max_abs},
                           {"ref_norm", t.ref_norm},
                           {"ok", pass}};
    std::printf("%s\n", line.dump().c_str());
  }
  nlohmann::json last = {{"fixture", fixture},
                         {"device", absl::GetFlag(FLAGS_device)},
                         {"ok", ok},
                         {"loss", report->loss},
                         {"ref_loss", report->ref_loss},
                         {"tensors", report->tensors.size()},
                         {"worst_rel_l2", worst},
                         {"bound", bound}};
  std::printf("%s\n", last.dump().c_str());
  return ok ? 0 : 1;
}

int train() {
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) return fail("train needs --config RUN.json");
  auto config = loom::load_run_config(path);
  if (!config.ok()) return fail(std::string(config.status().message()));
  auto summary = loom::run_training(*config, stderr);
  if (!summary.ok()) return fail(std::string(summary.status().message()));
  nlohmann::json line = {{"steps", summary->steps},
                         {"first_loss", summary->first_loss},
                         {"last_loss", summary->last_loss},
                         {"checkpoint", summary->last_checkpoint}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

int rl() {
  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) return fail("rl needs --config RL.json");
  auto config = loom::load_rl_config(path);
  if (!config.ok()) return fail(std::string(config.status().message()));
  auto summary = loom::run_rl(*config, stderr);
  if (!summary.ok()) return fail(std::string(summary.status().message()));
  nlohmann::json line = {{"steps", summary->steps},
                         {"first_reward", summary->first_reward},
                         {"last_reward", summary->last_reward},
                         {"first_third_reward", summary->first_reward_mean},
                         {"last_third_reward", summary->last_reward_mean},
                         {"warm_start_loss", summary->warm_start_loss},
                         {"initial_sync_s", summary->initial_sync_s},
                         {"stopped_by_time_limit", summary->stopped_by_time_limit},
                         {"checkpoint", summary->last_checkpoint}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

// Bad flags: exit 2 with the message.
int usage_error(const std::string& message) {
  std::fprintf(stderr, "loom-trainer eval: %s\n", message.c_str());
  return 2;
}

int eval() {
  loom::EvalOptions options;
  options.task = absl::GetFlag(FLAGS_task);
  options.samples = absl::GetFlag(FLAGS_samples);
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return usage_error("--model DIR is required");
  options.lengths.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v))
      return usage_error("--lengths: '" + std::string(part) + "' is not an integer");
    options.lengths.push_back(v);
  }
  options.depths.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_depths), ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v))
      return usage_error("--depths: '" + std::string(part) + "' is not a number");
    options.depths.push_back(v);
  }
  const int pairs = absl::GetFlag(FLAGS_mqar_pairs), mqar_len = absl::GetFlag(FLAGS_mqar_seq_len);
  if (options.task != "mqar" && (pairs != 0 || mqar_len != 0))
    return usage_error("--mqar_pairs and --mqar_seq_len are for --task mqar");
  if (pairs < 0) return usage_error("--mqar_pairs: must be 0 (16) or a count");
  if (mqar_len < 0) return usage_error("--mqar_seq_len: must be 0 or a length");
  options.mqar.num_pairs = pairs > 0 ? pairs : 16;
  if (mqar_len > 0) {
    options.mqar.spread = true;
    options.mqar.seq_len = mqar_len;
  }
  if (absl::Status st = options.validate(); !st.ok()) return usage_error(std::string(st.message()));
  auto device = loom::parse_device(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return usage_error("--device: " + std::string(device.status().message()));
  auto summary = loom::run_eval_on_model(dir, *device, options, stdout, stderr);
  if (!summary.ok()) return fail(std::string(summary.status().message()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-trainer prepare-data --tokenizer PATH --out FILE [--split file|paragraph] INPUT...\n"
      "       loom-trainer shard-info FILE\n"
      "       loom-trainer train --config RUN.json\n"
      "       loom-trainer rl --config RL.json\n"
      "       loom-trainer gradcheck --fixture DIR [--device cpu|cuda]\n"
      "       loom-trainer eval --model DIR --task passkey|mqar|tool [--lengths ...]\n"
      "                         [--depths ...] [--samples N] [--device cpu|cuda]\n"
      "                         [--mqar_pairs N] [--mqar_seq_len N]");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2)
    return fail("a command is required (prepare-data, shard-info, train, rl, gradcheck, eval)");
  const std::string command = positional[1];
  const std::vector<std::string> args(positional.begin() + 2, positional.end());
  if (command == "prepare-data") return prepare_data(args);
  if (command == "shard-info") return shard_info(args);
  if (command == "gradcheck") return gradcheck();
  if (command == "train") return train();
  if (command == "rl") return rl();
  if (command == "eval") return eval();
  return fail("unknown command '" + command +
              "' (prepare-data, shard-info, train, rl, gradcheck, eval)");
}
