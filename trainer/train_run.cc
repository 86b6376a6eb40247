#include "trainer/train_run.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint.h"
#include "trainer/token_shard.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<Model>> load_model(const RunConfig& c) {
  const Placement trainable{.trainable = true};
  if (!c.model_checkpoint.empty()) return Model::load(c.model_checkpoint, trainable);
  std::ifstream f(c.model_config);
  if (!f) return absl::NotFoundError(absl::StrCat("train: cannot read ", c.model_config));
  std::ostringstream text;
  text << f.rdbuf();
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(text.str()));
  return Model::load(cfg, WeightLoader::synthetic(cfg, c.model_seed), trainable);
}

// Windows of seq_len + 1 consecutive tokens, each from a shard and position drawn uniformly.
class ShardSampler {
 public:
  static absl::StatusOr<ShardSampler> open(const RunConfig& c, int64_t vocab) {
    ShardSampler s;
    for (const std::string& path : c.shards) {
      LOOM_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(path));
      if (shard.num_tokens() < c.seq_len + 1)
        return absl::InvalidArgumentError(absl::StrCat("train: shard ", path, " has ",
                                                       shard.num_tokens(), " tokens, fewer than ",
                                                       c.seq_len + 1));
      if (shard.max_token() >= vocab)
        return absl::InvalidArgumentError(absl::StrCat("train: shard ", path, " holds token ",
                                                       shard.max_token(), ", outside the model's ",
                                                       vocab, "-token vocabulary"));
      s.shards_.push_back(std::move(shard));
    }
    s.len_ = c.seq_len + 1;
    return s;
  }
  Example draw(std::mt19937_64& rng) const {
    std::uniform_int_distribution<size_t> which(0, shards_.size() - 1);
    const TokenShard& s = shards_[which(rng)];
    std::uniform_int_distribution<int64_t> at(0, s.num_tokens() - len_);
    Example ex;
    ex.tokens.resize(len_);
    s.read(at(rng), ex.tokens);
    ex.loss_mask.assign(len_, 1);
    ex.loss_mask.back() = 0;
    return ex;
  }

 private:
  std::vector<TokenShard> shards_;
  int64_t len_ = 0;
};

std::string clock(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

}  // namespace

absl::StatusOr<RunSummary> run_training(const RunConfig& c, std::FILE* progress) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, load_model(c));
  const int64_t vocab = model->config().vocab_size;
  LOOM_ASSIGN_OR_RETURN(TrainStep step, TrainStep::create(*model, c.optimizer));
  std::mt19937_64 rng(c.seed);
  if (!c.model_checkpoint.empty() &&
      fs::exists(fs::path(c.model_checkpoint) / "trainer_state.safetensors")) {
    LOOM_ASSIGN_OR_RETURN(TrainerMetadata meta, load_trainer_state(c.model_checkpoint, step));
    if (meta.contains("data_rng")) std::istringstream(meta["data_rng"]) >> rng;
  }
  std::unique_ptr<ShardSampler> shards;
  if (c.task == "shards") {
    LOOM_ASSIGN_OR_RETURN(ShardSampler s, ShardSampler::open(c, vocab));
    shards = std::make_unique<ShardSampler>(std::move(s));
  } else if (c.mqar.key_begin + c.mqar.num_keys > vocab ||
             c.mqar.value_begin + c.mqar.num_values > vocab || c.mqar.pad_id >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: the MQAR ids do not fit the model's ", vocab, "-token vocabulary"));
  }
  std::error_code ec;
  fs::create_directories(c.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("train: cannot create ", c.out));
  std::ofstream metrics(fs::path(c.out) / "metrics.jsonl", std::ios::app);
  if (!metrics) return absl::InternalError(absl::StrCat("train: cannot write in ", c.out));

  RunSummary summary;
  auto save = [&]() -> absl::Status {
    std::ostringstream rng_state;
    rng_state << rng;
    const std::string dir = (fs::path(c.out) / absl::StrCat("checkpoint-", step.steps())).string();
    LOOM_RETURN_IF_ERROR(save_checkpoint(dir, *model, step, {{"data_rng", rng_state.str()}}));
    summary.last_checkpoint = dir;
    return absl::OkStatus();
  };
  const auto start = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (int64_t i = 0; i < c.steps; ++i) {
    std::vector<Example> batch;
    for (int b = 0; b < c.batch_size; ++b)
      batch.push_back(shards ? shards->draw(rng) : make_mqar(c.mqar, rng));
    LOOM_ASSIGN_OR_RETURN(const StepStats stats, step.run(batch));
    tokens += stats.tokens;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tps = elapsed > 0 ? tokens / elapsed : 0;
    nlohmann::json line = {{"step", stats.step},           {"loss", stats.loss},
                           {"grad_norm", stats.grad_norm}, {"lr", stats.lr},
                           {"tokens", stats.tokens},       {"tokens_per_s", tps},
                           {"elapsed_s", elapsed}};
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
    metrics << line.dump() << "\n";
    metrics.flush();
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
    if (c.checkpoint_every > 0 && (i + 1) % c.checkpoint_every == 0 && i + 1 < c.steps)
      LOOM_RETURN_IF_ERROR(save());
  }
  if (progress != nullptr) std::fprintf(progress, "\n");
  LOOM_RETURN_IF_ERROR(save());
  return summary;
}

}  // namespace loom
