#include "trainer/rl/rl_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/chat/chat_template.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint.h"
#include "trainer/rl/policy_loss.h"
#include "trainer/rl/replay_buffer.h"
#include "trainer/rl/rollout.h"
#include "trainer/rl/routing_replay.h"
#include "trainer/tool_dialogues.h"
#include "trainer/train_run.h"
#include "trainer/train_step.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The run's model as the train command loads it, trainable on the run's device: the trainer's and
// the KL reference.
absl::StatusOr<std::unique_ptr<Model>> load_rl_model(const RlConfig& c) {
  return load_run_model(c.model_checkpoint, c.model_config, c.model_seed, "rl", c.device);
}

// The rollout engine's model: the run's architecture on the same device, its matrices in the
// engine's dtype, writable so that update_weights can replace them. Its values are the config's
// random ones until the first sync copies the trainer's in.
absl::StatusOr<std::unique_ptr<Model>> load_engine_model(const RlConfig& c) {
  Placement p;
  p.device = c.device;
  p.dtype = c.engine_weight_dtype;
  p.writable = true;
  return Model::load_random(c.model_checkpoint.empty() ? c.model_config : c.model_checkpoint,
                            c.model_seed, p);
}

// The model folder's tokenizer (copied into every checkpoint), else the byte-level one, as
// loom-server picks it.
struct RunTokenizer {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::vector<std::string> files;
};
absl::StatusOr<RunTokenizer> run_tokenizer(const RlConfig& c, const ModelConfig& cfg) {
  RunTokenizer t;
  const std::string folder = !c.model_checkpoint.empty()
                                 ? c.model_checkpoint
                                 : fs::path(c.model_config).parent_path().string();
  const std::string file = Tokenizer::format_in_dir(folder.empty() ? "." : folder);
  if (file.empty()) {
    t.tokenizer = Tokenizer::byte_level();
  } else {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::from_dir(folder));
    t.tokenizer = std::move(tok);
    for (const char* f : {"tokenizer.json", "tiktoken.model", "tokenizer_config.json"})
      if (fs::exists(fs::path(folder) / f)) t.files.push_back((fs::path(folder) / f).string());
  }
  if (t.tokenizer->vocab_size() > cfg.vocab_size)
    return absl::InvalidArgumentError(
        absl::StrCat("rl: the tokenizer's ", t.tokenizer->vocab_size(),
                     " tokens do not fit the model's vocabulary of ", cfg.vocab_size));
  return t;
}

double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return x.empty() ? 0 : s / static_cast<double>(x.size());
}

double population_std(const std::vector<double>& x) {
  const double m = mean(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return x.empty() ? 0 : std::sqrt(s / static_cast<double>(x.size()));
}

// RL.json log_samples: `count` episodes of step `step`, member k / groups of group k % groups,
// each the whole conversation as text, to `out` (RUN/samples.jsonl).
void write_samples(const std::vector<TrajectoryGroup>& groups, int count, int64_t step,
                   const Tokenizer& tokenizer, std::ofstream& out) {
  const int n = static_cast<int>(groups.size());
  if (count <= 0 || n == 0) return;
  const int episodes = n * static_cast<int>(groups[0].members.size());
  for (int k = 0; k < std::min(count, episodes); ++k) {
    const TrajectoryGroup& group = groups[k % n];
    const Trajectory& t = group.members[k / n];
    // A model whose vocabulary is padded past the tokenizer's may sample an id it cannot decode:
    // the sample says so rather than end the run.
    absl::StatusOr<std::string> decoded = tokenizer.decode(t.tokens);
    const std::string text =
        decoded.ok() ? *std::move(decoded)
                     : absl::StrCat("(not decodable: ", decoded.status().message(), ")");
    out << nlohmann::json{{"step", step},
                          {"group", k % n},
                          {"task_seed", group.task_seed},
                          {"reward", t.task_reward},
                          {"advantage", t.advantage},
                          {"answered", t.answered},
                          {"malformed", t.malformed},
                          {"truncated", t.truncated},
                          {"text", text}}
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
        << "\n";
  }
  out.flush();
}

}  // namespace

absl::StatusOr<RlRunSummary> run_rl(const RlConfig& c, std::FILE* progress) {
  const auto t_run = Clock::now();
  if (c.optimizer.balance == BalanceMethod::kAuxLoss)
    return absl::InvalidArgumentError(
        "rl: balance.method aux_loss is not supported (the policy objective carries no "
        "load-balancing term); use quantile or none");
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, load_rl_model(c));
  const ModelConfig& cfg = model->config();
  const bool record_routing = c.routing_replay != RoutingReplayMode::kOff;
  const bool replay_routing = c.routing_replay == RoutingReplayMode::kOn;
  if (record_routing &&
      std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) == cfg.ffns.end())
    return absl::InvalidArgumentError(
        "rl: routing_replay needs a model with MoE layers; this one has none (set it to \"off\")");
  RolloutOptions rollout_options = c.rollout;
  rollout_options.record_routing = record_routing;
  LOOM_ASSIGN_OR_RETURN(RunTokenizer tok, run_tokenizer(c, cfg));
  const ChatFormat format = chat_format_for_model_type(cfg.model_type);
  LOOM_ASSIGN_OR_RETURN(ChatSetup chat, chat_setup_for(format, *tok.tokenizer));
  std::mt19937_64 rng(c.seed);

  std::error_code ec;
  fs::create_directories(c.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("rl: cannot create ", c.out));
  std::ofstream metrics(fs::path(c.out) / "metrics.jsonl", std::ios::app);
  if (!metrics) return absl::InternalError(absl::StrCat("rl: cannot write in ", c.out));
  std::ofstream samples;
  if (c.log_samples > 0) {
    samples.open(fs::path(c.out) / "samples.jsonl", std::ios::app);
    if (!samples) return absl::InternalError(absl::StrCat("rl: cannot write in ", c.out));
  }
  RlRunSummary summary;

  // Warm start: supervised steps on the oracle conversations of fresh episodes, scoring only the
  // assistant turns (the tool-dialogue task's example layout), with its own constant rate.
  if (c.warm_start_steps > 0) {
    OptimizerOptions wo = c.optimizer;
    wo.lr = {.peak_lr = c.warm_start_lr,
             .min_lr = c.warm_start_lr,
             .warmup_steps = 0,
             .total_steps = c.warm_start_steps};
    LOOM_ASSIGN_OR_RETURN(TrainStep warm, TrainStep::create(*model, wo));
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, make_environment(c.env));
    for (int64_t i = 0; i < c.warm_start_steps; ++i) {
      std::vector<Example> batch;
      for (int b = 0; b < c.warm_start_batch; ++b) {
        EnvReset start = env->reset(rng());
        // Drawn only with a share, so runs without one keep their task sequence.
        const bool direct = c.warm_start_direct_share > 0 &&
                            std::bernoulli_distribution(c.warm_start_direct_share)(rng);
        const ToolDialogue demo{
            direct ? direct_answer_demonstration(env->demonstration()) : env->demonstration(),
            std::move(start.tools)};
        LOOM_ASSIGN_OR_RETURN(Example ex, make_tool_dialogue_example(*tok.tokenizer, format, demo));
        batch.push_back(std::move(ex));
      }
      LOOM_ASSIGN_OR_RETURN(StepStats st, warm.run(batch));
      summary.warm_start_loss = st.loss;
      metrics << nlohmann::json{{"warm_start_step", i + 1}, {"loss", st.loss}}.dump() << "\n";
      if (progress != nullptr)
        std::fprintf(progress, "\rwarm start %lld/%lld  loss %.4f ", static_cast<long long>(i + 1),
                     static_cast<long long>(c.warm_start_steps), st.loss);
    }
    if (progress != nullptr) std::fprintf(progress, "\n");
  }

  // The engine serves a copy of the (warm-started) weights, synced in below; the reference policy
  // of the KL term is that same starting point, frozen.
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> engine_model, load_engine_model(c));
  std::unique_ptr<Model> reference;
  if (c.grpo.kl_coef > 0) {
    LOOM_ASSIGN_OR_RETURN(reference, load_rl_model(c));
    for (const ParameterArena::Entry& e : model->parameters().entries())
      reference->parameters().find(e.name)->copy_from(e.tensor);
  }
  EngineOptions eo;
  eo.deterministic = c.deterministic;
  eo.max_num_batched_tokens = c.max_num_batched_tokens;
  eo.max_num_seqs = std::max(64, c.groups_per_step * c.group_size);
  eo.seed = c.seed + 1;  // every rollout request brings its own seed; this is never drawn
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::create(std::move(engine_model), tok.tokenizer, eo));
  // The first sync: the rollouts of step 1 run under weight version 1, the starting weights (in
  // the engine's dtype: a bf16 engine gets them rounded to nearest even).
  {
    const auto t_sync = Clock::now();
    LOOM_RETURN_IF_ERROR(engine->update_weights(model->parameters()).status());
    summary.initial_sync_s = seconds_since(t_sync);
  }
  if (progress != nullptr)
    std::fprintf(progress, "rl on %s: engine weights %s, first weight sync %.4fs\n",
                 device_name(c.device).c_str(),
                 std::string(weight_dtype_name(c.engine_weight_dtype)).c_str(),
                 summary.initial_sync_s);

  LOOM_ASSIGN_OR_RETURN(TrainStep step, TrainStep::create(*model, c.optimizer));
  ReplayBuffer replay(c.replay_capacity, c.replay_max_age);
  const int episodes = c.groups_per_step * c.group_size;
  std::vector<std::unique_ptr<Environment>> envs;
  for (int i = 0; i < episodes; ++i) {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, make_environment(c.env));
    envs.push_back(std::move(env));
  }
  auto save = [&]() -> absl::Status {
    const std::string dir = (fs::path(c.out) / absl::StrCat("checkpoint-", step.steps())).string();
    const TrainerMetadata meta = {
        {"rl_weight_version", absl::StrCat(engine->stats().weight_version)}};
    LOOM_RETURN_IF_ERROR(save_checkpoint(dir, *model, step, meta, tok.files));
    summary.last_checkpoint = dir;
    return absl::OkStatus();
  };

  std::vector<double> step_rewards;
  for (int64_t s = 1; s <= c.steps; ++s) {
    // The time limit ends the run between steps (the first always runs), with its checkpoint.
    if (s > 1 && c.time_limit_s > 0 && seconds_since(t_run) >= c.time_limit_s) {
      summary.stopped_by_time_limit = true;
      break;
    }
    // Rollouts: every episode of the step at once, so the engine batches them.
    std::vector<EpisodeSpec> specs(episodes);
    std::vector<uint64_t> task_seeds(c.groups_per_step);
    for (int g = 0; g < c.groups_per_step; ++g) {
      task_seeds[g] = rng();
      for (int k = 0; k < c.group_size; ++k)
        specs[g * c.group_size + k] = {.env = envs[g * c.group_size + k].get(),
                                       .env_seed = task_seeds[g],
                                       .sample_seed = rng()};
    }
    const auto t_rollout = Clock::now();
    LOOM_ASSIGN_OR_RETURN(std::vector<Trajectory> trs,
                          run_rollouts(*engine, *tok.tokenizer, chat, specs, rollout_options));
    const double rollout_s = seconds_since(t_rollout);

    // Scoring: the trainer's logprobs at the rollout's weights (the trainer's model is what the
    // engine serves: the ratio's denominator), the reference's, rewards and advantages.
    const auto t_train = Clock::now();
    int64_t train_tokens = 0, response_tokens = 0;
    std::vector<double> rewards, lengths, turns;
    int64_t correct = 0, answered = 0, truncated = 0, malformed = 0;
    // Routing replay: the scoring forwards replay (or, measuring, compare with) the engine's
    // experts; their counters give the step's disagreement between the two routers.
    int64_t replayed_slots = 0, differing_slots = 0;
    double coverage = 0;
    for (Trajectory& tr : trs) {
      std::optional<RoutingReplay> routing;
      if (record_routing) {
        LOOM_ASSIGN_OR_RETURN(routing, routing_replay_of(tr, cfg, replay_routing));
        coverage += routing_coverage(tr) / static_cast<double>(trs.size());
      }
      LOOM_ASSIGN_OR_RETURN(tr.old_logp,
                            token_logprobs(*model, tr.tokens, routing ? &*routing : nullptr));
      if (routing) {
        replayed_slots += routing->replayed_slots;
        differing_slots += routing->differing_slots;
      }
      if (reference) {
        // The reference scores the same experts when replaying (its counters are not the step's).
        std::optional<RoutingReplay> ref_routing;
        if (replay_routing) {
          LOOM_ASSIGN_OR_RETURN(ref_routing, routing_replay_of(tr, cfg, true));
        }
        LOOM_ASSIGN_OR_RETURN(tr.ref_logp, token_logprobs(*reference, tr.tokens,
                                                          ref_routing ? &*ref_routing : nullptr));
      }
      train_tokens += static_cast<int64_t>(tr.tokens.size());
      response_tokens += tr.response_tokens;
      rewards.push_back(tr.task_reward);
      lengths.push_back(static_cast<double>(tr.response_tokens));
      turns.push_back(tr.turns);
      correct += tr.task_reward > 0 ? 1 : 0;
      answered += tr.answered ? 1 : 0;
      truncated += tr.truncated ? 1 : 0;
      malformed += tr.malformed ? 1 : 0;
    }
    std::vector<TrajectoryGroup> groups(c.groups_per_step);
    std::vector<bool> kept(c.groups_per_step);
    int dropped = 0;
    for (int g = 0; g < c.groups_per_step; ++g) {
      TrajectoryGroup& group = groups[g];
      group.task_seed = task_seeds[g];
      group.version = trs[g * c.group_size].version;
      for (int k = 0; k < c.group_size; ++k)
        group.members.push_back(std::move(trs[g * c.group_size + k]));
      kept[g] = score_group(group, c.grpo);
      if (!kept[g]) ++dropped;
    }
    write_samples(groups, c.log_samples, s, *tok.tokenizer, samples);
    const int64_t version = engine->stats().weight_version;
    const std::vector<const TrajectoryGroup*> replayed =
        c.replay_groups > 0 ? replay.sample(c.replay_groups, version, rng)
                            : std::vector<const TrajectoryGroup*>{};
    std::vector<const Trajectory*> batch;
    for (int g = 0; g < c.groups_per_step; ++g)
      if (kept[g])
        for (const Trajectory& t : groups[g].members) batch.push_back(&t);
    for (const TrajectoryGroup* g : replayed)
      for (const Trajectory& t : g->members) batch.push_back(&t);

    // The update: one AdamW step on the token-mean objective (already normalised: scale 1).
    PolicyLossStats pl;
    StepStats st;
    bool updated = false;
    double sync_s = 0;
    if (!batch.empty()) {
      Gradients& grads = step.begin();
      LOOM_ASSIGN_OR_RETURN(
          pl, accumulate_policy_gradient(*model, batch, c.grpo, grads, replay_routing, version));
      for (const Trajectory* t : batch) train_tokens += static_cast<int64_t>(t->tokens.size());
      if (pl.tokens > 0) {
        LOOM_ASSIGN_OR_RETURN(st, step.update(1.0));
        updated = true;
      }
    }
    const double train_s = seconds_since(t_train);
    // With the routing recorded, a step without an update syncs too: the sync drops the prefix
    // cache, so the next rollouts compute (and record) every position themselves rather than
    // hit prefixes this step's requests computed.
    if (updated || record_routing) {
      // Weight sync: the engine serves the new weights from the next rollout on.
      const auto t_sync = Clock::now();
      LOOM_RETURN_IF_ERROR(engine->update_weights(model->parameters()).status());
      sync_s = seconds_since(t_sync);
    }
    // Kept groups become replayable once trained on (the buffer copies them; drawn pointers of
    // this step are no longer needed).
    for (int g = 0; g < c.groups_per_step; ++g)
      if (kept[g]) replay.add(groups[g]);

    const double reward_mean = mean(rewards);
    step_rewards.push_back(reward_mean);
    nlohmann::json line = {
        {"step", s},
        {"weight_version", version},
        {"reward_mean", reward_mean},
        {"reward_std", population_std(rewards)},
        {"completion", static_cast<double>(correct) / episodes},
        {"answered", static_cast<double>(answered) / episodes},
        {"truncated", static_cast<double>(truncated) / episodes},
        {"malformed", static_cast<double>(malformed) / episodes},
        {"response_length", mean(lengths)},
        {"turns", mean(turns)},
        {"groups_dropped", static_cast<double>(dropped) / c.groups_per_step},
        {"replayed_groups", replayed.size()},
        {"updated", updated},
        {"policy_tokens", pl.tokens},
        {"loss", pl.loss},
        {"clip_fraction", pl.clip_fraction},
        {"entropy", pl.entropy},
        {"tis_mean", pl.tis_mean},
        {"logprob_mismatch", pl.mismatch},
        {"grad_norm", st.grad_norm},
        {"lr", st.lr},
        {"rollout_s", rollout_s},
        {"rollout_tokens_per_s", rollout_s > 0 ? response_tokens / rollout_s : 0.0},
        {"train_s", train_s},
        {"train_tokens_per_s", train_s > 0 ? train_tokens / train_s : 0.0},
        {"weight_sync_s", sync_s}};
    if (c.grpo.kl_coef > 0) line["kl"] = pl.kl;
    if (record_routing) {
      line["routing_differing"] =
          replayed_slots > 0 ? static_cast<double>(differing_slots) / replayed_slots : 0.0;
      line["routing_replayed_slots"] = replayed_slots;
      line["routing_coverage"] = coverage;
    }
    metrics << line.dump() << "\n";
    metrics.flush();
    if (progress != nullptr) {
      std::fprintf(progress,
                   "step %lld/%lld  reward %.3f  dropped %d/%d  rollout %.1fs  train %.1fs  "
                   "sync %.3fs\n",
                   static_cast<long long>(s), static_cast<long long>(c.steps), reward_mean, dropped,
                   c.groups_per_step, rollout_s, train_s, sync_s);
      std::fflush(progress);
    }
    if (c.checkpoint_every > 0 && s % c.checkpoint_every == 0 && s < c.steps)
      LOOM_RETURN_IF_ERROR(save());
  }
  LOOM_RETURN_IF_ERROR(save());
  summary.steps = static_cast<int64_t>(step_rewards.size());
  summary.first_reward = step_rewards.front();
  summary.last_reward = step_rewards.back();
  const size_t k = std::max<size_t>(1, step_rewards.size() / 3);
  summary.first_reward_mean =
      mean(std::vector<double>(step_rewards.begin(), step_rewards.begin() + k));
  summary.last_reward_mean = mean(std::vector<double>(step_rewards.end() - k, step_rewards.end()));
  return summary;
}

}  // namespace loom
