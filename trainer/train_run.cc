#include "trainer/train_run.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/chat/chat_template.h"
#include "engine/model/model.h"
#include "engine/parallel/rank_group.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint.h"
#include "trainer/stages.h"
#include "trainer/token_shard.h"
#include "trainer/tool_dialogues.h"
#include "weights/weight_loader.h"

#ifdef LOOM_WITH_NCCL
#include "engine/parallel/nccl_communicator.h"
#include "engine/parallel/node_rendezvous.h"
#include "engine/parallel/tcp_communicator.h"
#endif

namespace loom {
namespace {

namespace fs = std::filesystem;

// Windows of seq_len + 1 consecutive tokens, each from a shard and position drawn uniformly.
class ShardSampler {
 public:
  // `seq_len`: the longest window the run draws, less one.
  static absl::StatusOr<ShardSampler> open(const RunConfig& c, int64_t seq_len, int64_t vocab) {
    ShardSampler s;
    for (const std::string& path : c.shards) {
      LOOM_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(path));
      if (shard.num_tokens() < seq_len + 1)
        return absl::InvalidArgumentError(absl::StrCat("train: shard ", path, " has ",
                                                       shard.num_tokens(), " tokens, fewer than ",
                                                       seq_len + 1));
      if (shard.max_token() >= vocab)
        return absl::InvalidArgumentError(absl::StrCat("train: shard ", path, " holds token ",
                                                       shard.max_token(), ", outside the model's ",
                                                       vocab, "-token vocabulary"));
      s.shards_.push_back(std::move(shard));
    }
    return s;
  }
  Example draw(std::mt19937_64& rng, int64_t seq_len) const {
    const int64_t len = seq_len + 1;
    std::uniform_int_distribution<size_t> which(0, shards_.size() - 1);
    const TokenShard& s = shards_[which(rng)];
    std::uniform_int_distribution<int64_t> at(0, s.num_tokens() - len);
    Example ex;
    ex.tokens.resize(len);
    s.read(at(rng), ex.tokens);
    ex.loss_mask.assign(len, 1);
    ex.loss_mask.back() = 0;
    return ex;
  }

 private:
  std::vector<TokenShard> shards_;
};

// The text tasks' encoder (tool dialogues and passkeys): the tokenizer (data.tokenizer, else the
// model folder's, else the byte-level one, as loom-server and `eval` pick it), the files a
// checkpoint must carry so that it is served and evaluated with that tokenizer, and the model
// family's chat format.
struct TextEncoder {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> files;
  ChatFormat format = ChatFormat::kNative;
};

absl::StatusOr<TextEncoder> text_encoder(const RunConfig& c, const ModelConfig& cfg) {
  TextEncoder enc;
  std::string path = c.tokenizer;
  if (path.empty()) {
    const std::string folder = !c.model_checkpoint.empty()
                                   ? c.model_checkpoint
                                   : fs::path(c.model_config).parent_path().string();
    path = Tokenizer::format_in_dir(folder.empty() ? "." : folder).empty() ? "byte" : folder;
  }
  std::error_code ec;
  if (path == "byte") {
    enc.tokenizer = Tokenizer::byte_level();
  } else if (fs::is_directory(path, ec)) {
    LOOM_ASSIGN_OR_RETURN(enc.tokenizer, Tokenizer::from_dir(path));
    const fs::path dir(path);
    for (const char* f : {"tokenizer.json", "tiktoken.model", "tokenizer_config.json"})
      if (fs::exists(dir / f, ec)) enc.files.push_back((dir / f).string());
  } else {
    LOOM_ASSIGN_OR_RETURN(enc.tokenizer, Tokenizer::from_file(path));
    if (fs::path(path).filename() != "tokenizer.json")
      return absl::InvalidArgumentError(absl::StrCat(
          "train: data.tokenizer ", path,
          " must be named tokenizer.json (checkpoints carry it under its name for the server)"));
    enc.files.push_back(path);
  }
  if (enc.tokenizer->vocab_size() > cfg.vocab_size)
    return absl::InvalidArgumentError(
        absl::StrCat("train: the tokenizer's ", enc.tokenizer->vocab_size(),
                     " ids do not fit the model's vocabulary of ", cfg.vocab_size));
  enc.format = chat_format_for_model_type(cfg.model_type);
  return enc;
}

// One tool-use dialogue as a training example (the assistant turns scored). Examples are not
// padded: TrainStep runs every example as its own sequence, so padding would only cost compute.
// An example longer than seq_len is refused rather than cut, which would drop scored turns.
absl::StatusOr<Example> draw_dialogue(const TextEncoder& enc, const ToolDialogueOptions& o,
                                      int64_t seq_len, std::mt19937_64& rng) {
  LOOM_ASSIGN_OR_RETURN(Example ex, make_tool_dialogue_example(*enc.tokenizer, enc.format,
                                                               make_tool_dialogue(o, rng)));
  if (static_cast<int64_t>(ex.tokens.size()) > seq_len)
    return absl::InvalidArgumentError(absl::StrCat(
        "train: a tool dialogue of ", ex.tokens.size(), " tokens is longer than seq_len ", seq_len,
        " (raise data.seq_len or the stage's seq_len, or lower tool_dialogue.max_turns)"));
  return ex;
}

// Every passkey option of the run (data.passkey and each stage's) must leave room for the task's
// fixed sentences in this tokenizer at min_context: checked once at the start rather than at the
// first unlucky draw.
absl::Status check_passkey_fits(const RunConfig& c, const Tokenizer& tok) {
  auto check = [&](const PasskeyTrainOptions& o, const std::string& where) -> absl::Status {
    std::mt19937_64 scratch(0);
    const absl::StatusOr<Example> ex = make_passkey(
        tok, {.context_tokens = o.min_context, .depth = 0.5, .digits = o.digits}, scratch);
    if (!ex.ok())
      return absl::InvalidArgumentError(absl::StrCat("train: ", where, ".min_context ",
                                                     o.min_context, ": ", ex.status().message()));
    return absl::OkStatus();
  };
  if (c.stages.empty()) return check(c.passkey, "data.passkey");
  for (size_t i = 0; i < c.stages.size(); ++i)
    LOOM_RETURN_IF_ERROR(check(c.stages[i].passkey, absl::StrCat("stages[", i, "].passkey")));
  return absl::OkStatus();
}

// loss_by_position: the mean loss of the scored positions in each bucket (null where none).
nlohmann::json loss_by_position(const StepStats& stats, int64_t seq_len, int64_t first) {
  nlohmann::json out = nlohmann::json::array();
  for (const PositionBucket& b : position_buckets(seq_len, first)) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t t = b.begin; t < b.end && t < static_cast<int64_t>(stats.position_loss.size());
         ++t) {
      sum += stats.position_loss[t];
      n += stats.position_scored[t];
    }
    out.push_back({{"begin", b.begin},
                   {"end", b.end},
                   {"tokens", n},
                   {"loss", n > 0 ? nlohmann::json(sum / static_cast<double>(n)) : nullptr}});
  }
  return out;
}

std::string clock(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> load_run_model(const std::string& checkpoint,
                                                      const std::string& config, uint64_t seed,
                                                      std::string_view what, Device device) {
  const Placement trainable{.device = device, .dtype = WeightDType::kF32, .trainable = true};
  if (!checkpoint.empty()) return Model::load(checkpoint, trainable);
  std::ifstream f(config);
  if (!f) return absl::NotFoundError(absl::StrCat(std::string(what), ": cannot read ", config));
  std::ostringstream text;
  text << f.rdbuf();
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(text.str()));
  return Model::load(cfg, WeightLoader::synthetic(cfg, seed), trainable);
}

namespace {

// One replica's run: the whole run with `dp` null; with data parallelism rank dp->rank(), which
// draws every batch as every rank does (the same seed), runs its share and writes the metrics and
// checkpoints only as rank 0 (every rank holds the same weights and optimizer state).
absl::StatusOr<RunSummary> train_rank(const RunConfig& c, std::FILE* progress, Communicator* dp) {
  const bool writer = dp == nullptr || dp->rank() == 0;
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      load_run_model(c.model_checkpoint, c.model_config, c.model_seed, "train", c.device));
  LOOM_RETURN_IF_ERROR(model->set_matmul_precision(c.matmul));
  const int64_t vocab = model->config().vocab_size;
  LOOM_ASSIGN_OR_RETURN(TrainStep step, TrainStep::create(*model, c.optimizer));
  step.set_data_parallel(dp);
  std::mt19937_64 rng(c.seed);
  // Staged runs: the stage, its step count and its recent losses (the stability window's 2W).
  const bool staged = !c.stages.empty();
  size_t stage = 0;
  int64_t stage_steps = 0;
  std::vector<double> stage_losses;
  if (!c.model_checkpoint.empty() &&
      fs::exists(fs::path(c.model_checkpoint) / "trainer_state.safetensors")) {
    LOOM_ASSIGN_OR_RETURN(TrainerMetadata meta, load_trainer_state(c.model_checkpoint, step));
    if (meta.contains("data_rng")) std::istringstream(meta["data_rng"]) >> rng;
    if (staged && meta.contains("stage")) {
      const nlohmann::json st = nlohmann::json::parse(meta["stage"], nullptr, false);
      if (st.is_discarded() || !st.contains("index") || !st["index"].is_number_unsigned() ||
          st["index"].get<size_t>() >= c.stages.size() || !st.contains("steps") ||
          !st["steps"].is_number_integer() || !st.contains("losses") || !st["losses"].is_array())
        return absl::InvalidArgumentError(
            absl::StrCat("train: the checkpoint's stage record does not fit this run's ",
                         c.stages.size(), " stages: ", meta["stage"]));
      stage = st["index"].get<size_t>();
      stage_steps = st["steps"].get<int64_t>();
      stage_losses = st["losses"].get<std::vector<double>>();
    }
  }
  int64_t max_len = staged ? 0 : c.seq_len;
  for (const StageConfig& s : c.stages) max_len = std::max<int64_t>(max_len, s.seq_len);
  std::unique_ptr<ShardSampler> shards;
  std::optional<TextEncoder> text;
  if (run_uses_task(c, "tool_dialogue") || run_uses_task(c, "passkey")) {
    LOOM_ASSIGN_OR_RETURN(text, text_encoder(c, model->config()));
  }
  if (run_uses_task(c, "passkey")) LOOM_RETURN_IF_ERROR(check_passkey_fits(c, *text->tokenizer));
  if (c.task == "shards") {
    LOOM_ASSIGN_OR_RETURN(ShardSampler s, ShardSampler::open(c, max_len, vocab));
    shards = std::make_unique<ShardSampler>(std::move(s));
  }
  if (run_uses_task(c, "mqar")) {
    std::vector<MqarOptions> mixes = {c.mqar};
    for (const StageConfig& s : c.stages) mixes.push_back(s.mqar);
    for (const MqarOptions& m : mixes)
      if (m.key_begin + m.num_keys > vocab || m.value_begin + m.num_values > vocab ||
          m.pad_id >= vocab)
        return absl::InvalidArgumentError(absl::StrCat(
            "train: the MQAR ids do not fit the model's ", vocab, "-token vocabulary"));
  }
  std::ofstream metrics;
  if (writer) {
    std::error_code ec;
    fs::create_directories(c.out, ec);
    if (ec) return absl::InternalError(absl::StrCat("train: cannot create ", c.out));
    metrics.open(fs::path(c.out) / "metrics.jsonl", std::ios::app);
    if (!metrics) return absl::InternalError(absl::StrCat("train: cannot write in ", c.out));
  }

  // Enters stage `stage`: its RoPE base (a note when the model has no rotary layers).
  std::string rope_note;
  auto enter_stage = [&]() {
    const StageConfig& s = c.stages[stage];
    if (s.rope_theta > 0 && model->set_rope_theta(s.rope_theta) == 0)
      rope_note = "no rotary layers: rope_theta ignored";
  };
  if (staged) enter_stage();

  RunSummary summary;
  auto save = [&]() -> absl::Status {
    if (!writer) return absl::OkStatus();
    std::ostringstream rng_state;
    rng_state << rng;
    TrainerMetadata meta = {{"data_rng", rng_state.str()}};
    if (staged)
      meta["stage"] =
          nlohmann::json{{"index", stage}, {"steps", stage_steps}, {"losses", stage_losses}}.dump();
    const std::string dir = (fs::path(c.out) / absl::StrCat("checkpoint-", step.steps())).string();
    LOOM_RETURN_IF_ERROR(
        save_checkpoint(dir, *model, step, meta, text ? text->files : std::vector<std::string>{}));
    summary.last_checkpoint = dir;
    return absl::OkStatus();
  };
  // data.task mix: each example's task, in proportion to the weights (a stage's own, if it has
  // them).
  std::vector<double> weights;
  for (const TaskWeight& t : c.mix) weights.push_back(t.weight);
  std::vector<std::discrete_distribution<size_t>> mix_picks(
      1, std::discrete_distribution<size_t>(weights.begin(), weights.end()));
  for (const StageConfig& s : c.stages)
    mix_picks.push_back(s.mix_weights.empty() ? mix_picks[0]
                                              : std::discrete_distribution<size_t>(
                                                    s.mix_weights.begin(), s.mix_weights.end()));
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  bool done = false;
  for (int64_t i = 0; i < c.steps && !done; ++i) {
    const int64_t seq_len = staged ? c.stages[stage].seq_len : c.seq_len;
    const MqarOptions& mqar = staged ? c.stages[stage].mqar : c.mqar;
    const ToolDialogueOptions& tool = staged ? c.stages[stage].tool_dialogue : c.tool_dialogue;
    const PasskeyTrainOptions& passkey = staged ? c.stages[stage].passkey : c.passkey;
    std::discrete_distribution<size_t>& mix_pick = mix_picks[staged ? stage + 1 : 0];
    std::vector<Example> batch;
    for (int b = 0; b < c.batch_size; ++b) {
      const std::string& task = c.task == "mix" ? c.mix[mix_pick(rng)].task : c.task;
      if (task == "tool_dialogue") {
        LOOM_ASSIGN_OR_RETURN(Example ex, draw_dialogue(*text, tool, seq_len, rng));
        batch.push_back(std::move(ex));
      } else if (task == "passkey") {
        LOOM_ASSIGN_OR_RETURN(Example ex, draw_passkey(*text->tokenizer, passkey, seq_len, rng));
        batch.push_back(std::move(ex));
      } else if (shards) {
        batch.push_back(shards->draw(rng, seq_len));
      } else {
        Example ex = make_mqar(mqar, rng);
        drop_unscored_tail(ex);  // the padding after the queries
        batch.push_back(std::move(ex));
      }
      if (c.score_all_tokens) score_all_tokens(batch.back());
    }
    LOOM_ASSIGN_OR_RETURN(const StepStats stats, step.run(batch));
    tokens += stats.tokens;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tps = elapsed > 0 ? tokens / elapsed : 0;
    nlohmann::json line = {{"step", stats.step},           {"loss", stats.loss},
                           {"grad_norm", stats.grad_norm}, {"lr", stats.lr},
                           {"tokens", stats.tokens},       {"tokens_per_s", tps},
                           {"elapsed_s", elapsed}};
    if (c.optimizer.balance == BalanceMethod::kAuxLoss) line["aux_loss"] = stats.aux_loss;
    line["loss_by_position"] = loss_by_position(stats, seq_len, c.loss_bucket);
    StageEnd end = StageEnd::kNone;
    if (staged) {
      line["stage"] = stage;
      line["seq_len"] = seq_len;
      if (!rope_note.empty()) line["rope_note"] = std::exchange(rope_note, "");
      ++stage_steps;
      stage_losses.push_back(stats.loss);
      const size_t keep = 2 * static_cast<size_t>(c.stage_stability.window);
      if (stage_losses.size() > keep)
        stage_losses.erase(stage_losses.begin(), stage_losses.end() - keep);
      end = stage_end(c.stages[stage], c.stage_stability, stage_steps, stage_losses);
      if (end != StageEnd::kNone) line["stage_ended"] = stage_end_name(end);
    }
    for (const StepStats::Routing& r : stats.routing) {
      line["routing"].push_back({{"bias", r.bias},
                                 {"load_entropy", r.health.load_entropy},
                                 {"max_violation", r.health.max_violation},
                                 {"idle_fraction", r.health.idle_fraction},
                                 {"bias_update_l1", r.health.bias_update_l1}});
      int layer = -1;
      std::sscanf(r.bias.c_str(), "layers.%d.", &layer);
      if (progress != nullptr)
        for (const std::string& w : routing_warnings(c.optimizer.balancer, layer, r.health))
          std::fprintf(progress, "\nrouting warning: %s", w.c_str());
    }
    if (writer) {
      metrics << line.dump() << "\n";
      metrics.flush();
    }
    if (i == 0) summary.first_loss = stats.loss;
    summary.last_loss = stats.loss;
    summary.steps = i + 1;
    if (progress != nullptr) {
      const double eta = (i + 1) < c.steps ? elapsed / (i + 1) * (c.steps - i - 1) : 0;
      std::fprintf(progress, "\rstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %s ",
                   static_cast<long long>(i + 1), static_cast<long long>(c.steps), stats.loss, tps,
                   clock(eta).c_str());
      std::fflush(progress);
    }
    if (end != StageEnd::kNone) {
      if (stage + 1 == c.stages.size()) {
        done = true;  // the last stage ended: so does the run
      } else {
        ++stage;
        stage_steps = 0;
        stage_losses.clear();
        enter_stage();
        if (progress != nullptr)
          std::fprintf(progress,
                       "\nstage %zu/%zu after step %lld (%s): seq_len %d, rope_theta %g\n",
                       stage + 1, c.stages.size(), static_cast<long long>(stats.step),
                       std::string(stage_end_name(end)).c_str(), c.stages[stage].seq_len,
                       model->config().rope.theta);
      }
    }
    if (c.checkpoint_every > 0 && (i + 1) % c.checkpoint_every == 0 && i + 1 < c.steps && !done)
      LOOM_RETURN_IF_ERROR(save());
  }
  if (progress != nullptr) std::fprintf(progress, "\n");
  LOOM_RETURN_IF_ERROR(save());
  return summary;
}

}  // namespace

absl::StatusOr<RunSummary> run_training(const RunConfig& c, std::FILE* progress) {
  if (c.data_parallel == 1) return train_rank(c, progress, nullptr);
  // A rank waits this long at a collective for the others (rank 0 may be writing a checkpoint).
  const absl::Duration timeout = absl::Minutes(30);
  RunSummary summary;
  auto body = [&](Communicator& comm) -> absl::Status {
    RunConfig rank_config = c;
    if (c.device.is_cuda()) rank_config.device = Device::cuda(comm.rank());
    LOOM_ASSIGN_OR_RETURN(RunSummary s,
                          train_rank(rank_config, comm.rank() == 0 ? progress : nullptr, &comm));
    if (comm.rank() == 0) summary = std::move(s);
    return absl::OkStatus();
  };
  if (c.device.is_cpu()) {
    LOOM_RETURN_IF_ERROR(run_thread_ranks(c.data_parallel, timeout, body));
    return summary;
  }
  for (int r = 0; r < c.data_parallel; ++r) {
    const absl::Status ok = device_available(Device::cuda(r));
    if (!ok.ok())
      return absl::FailedPreconditionError(absl::StrCat("train: data_parallel ", c.data_parallel,
                                                        " runs rank ", r, " on cuda:", r, ": ",
                                                        ok.message()));
  }
#ifdef LOOM_WITH_NCCL
  LOOM_ASSIGN_OR_RETURN(const std::string id, nccl_unique_id());
  LOOM_ASSIGN_OR_RETURN(
      Rendezvous rv,
      rendezvous({.nnodes = 1, .local_ranks = c.data_parallel, .world_size = c.data_parallel}));
  std::vector<int> devices(static_cast<size_t>(c.data_parallel));
  std::iota(devices.begin(), devices.end(), 0);
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclGroup> group,
      NcclGroup::create(std::make_unique<TcpGroup>(std::move(rv), timeout), id, devices, timeout));
  LOOM_RETURN_IF_ERROR(run_local_ranks(*group, body));
  return summary;
#else
  return absl::FailedPreconditionError(
      "train: data_parallel on CUDA needs a build with NCCL (this one has none)");
#endif
}

}  // namespace loom
