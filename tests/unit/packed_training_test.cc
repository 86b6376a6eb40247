// Model::loss_and_gradients_packed against its oracle, the per-sequence calls: every sequence's
// loss and row losses, every parameter's gradient, the MoE expert counts and auxiliary loss, for
// fixture models covering KDA, GDN, MLA, GQA, MoE and Block AttnRes; row weights; its refusals;
// and TrainStep and a whole training run with and without packing.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/training_batch.h"
#include "gtest/gtest.h"
#include "kernels/kda.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/train_run.h"
#include "trainer/train_step.h"
#include "weights/model_config.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

Tensor i64s(std::vector<int64_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

// A layout's host copies, when it has them, are what training_sequences reads (the training
// backward's own layout keeps them, so that no layer's backward reads the step data back from a
// GPU); without them it reads the step data itself. Past positions are refused either way.
TEST(TrainingSequences, HostCopiesFirst) {
  BatchLayout layout;
  layout.cu_seqlens = i64s({0, 3, 7});
  layout.past_lens = i64s({0, 0});
  auto seqs = training_sequences(layout);
  ASSERT_TRUE(seqs.ok()) << seqs.status();
  EXPECT_EQ(*seqs, (std::vector<RowSpan>{{0, 3}, {3, 7}}));
  layout.host_cu_seqlens = i64s({0, 5, 7});
  layout.host_past_lens = i64s({0, 0});
  seqs = training_sequences(layout);
  ASSERT_TRUE(seqs.ok()) << seqs.status();
  EXPECT_EQ(*seqs, (std::vector<RowSpan>{{0, 5}, {5, 7}}));
  layout.host_past_lens = i64s({0, 2});
  EXPECT_EQ(training_sequences(layout).status().code(), absl::StatusCode::kFailedPrecondition);
}
using json = nlohmann::json;

// Packing changes only the order of f32 sums: GEMMs over more rows (OpenBLAS blocks and edges
// them differently), the cross-entropy's row chunks, and parameter gradients summed over all rows
// at once instead of sequence by sequence. The bounds are per fixture, from what summation order
// alone does to the per-sequence calls (measured: OpenBLAS on 1 against 2 threads, same inputs;
// worst row-loss ratio, worst gradient relative L2): kimi_linear_s0 2.3e-6 and 9.4e-6,
// deepseek_v3_s1 1.9e-6 and 5.0e-6, qwen3_next_s0 1.9e-5 and 6.4e-5 (GDN's L2 norms of small
// vectors amplify it), fla_kda_s0 1.1e-4 and 4.4e-4 (model_gradients_test.cc). Packing measured
// 1.7e-6 / 1.7e-5, 2.6e-6 / 7.5e-6, 1.8e-5 / 7.0e-5 and 8.5e-5 / 3.0e-4: the same. A missing
// sequence, a state carried from one sequence into the next or a mean over the wrong rows moves
// them by 1e-2 or more.
struct Bounds {
  double row, grad;  // relative: a row loss (and a sequence's loss), a gradient's L2
};
Bounds bounds_for(const std::string& fixture) {
  if (fixture == "fla_kda_s0") return {5e-4, 1e-3};
  if (fixture == "qwen3_next_s0") return {1e-4, 3e-4};
  return {2e-5, 1e-4};
}
// A whole TrainStep's loss over a batch (a mean of means: less noisy than one row).
constexpr double kLossBound = 1e-5;

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = static_cast<double>(a.data<float>()[i]) - b.data<float>()[i];
    num += d * d;
    den += static_cast<double>(b.data<float>()[i]) * b.data<float>()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<float> weights;
};

// Sequences of `lengths` random ids clear of the special tokens; the second gets a loss mask that
// skips every third position, and with `weighted` each gets row weights in [-1, 1].
std::vector<Seq> random_sequences(const std::vector<int64_t>& lengths, int64_t vocab,
                                  bool weighted) {
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int32_t> id(
      3, static_cast<int32_t>(std::min<int64_t>(vocab, 300)) - 1);
  std::uniform_real_distribution<float> w(-1.0f, 1.0f);
  std::vector<Seq> out;
  for (size_t s = 0; s < lengths.size(); ++s) {
    Seq q;
    for (int64_t t = 0; t < lengths[s]; ++t) q.tokens.push_back(id(rng));
    if (s == 1) {
      for (int64_t t = 0; t < lengths[s]; ++t) q.mask.push_back(t % 3 != 0 && t + 1 < lengths[s]);
    }
    if (weighted)
      for (int64_t t = 0; t < lengths[s]; ++t) q.weights.push_back(w(rng));
    out.push_back(std::move(q));
  }
  return out;
}

// Lengths on both sides of the chunked forms' threshold (kKdaRecurrentMaxTokens: the recurrence
// up to it), none a multiple of the 64-row chunk, the longest not first.
const std::vector<int64_t> kLengths = {77, kKdaRecurrentMaxTokens - 3, 130, 33};

void expect_packed_matches(const std::string& fixture, bool weighted, float aux_alpha) {
  SCOPED_TRACE(fixture);
  const Bounds bound = bounds_for(fixture);
  const std::string dir = loom::testing::kFixtures + "/" + fixture;
  auto model = Model::load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Seq> seqs = random_sequences(kLengths, (*model)->config().vocab_size, weighted);

  Gradients each;
  each.set_aux_loss_alpha(aux_alpha);
  std::vector<double> losses;
  std::vector<float> rows, all_rows;
  for (const Seq& q : seqs) {
    auto loss = (*model)->loss_and_gradients(q.tokens, each, q.mask, &rows, q.weights);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    all_rows.insert(all_rows.end(), rows.begin(), rows.end());
  }

  Gradients packed;
  packed.set_aux_loss_alpha(aux_alpha);
  std::vector<TrainingSequence> in;
  for (const Seq& q : seqs) in.push_back({q.tokens, q.mask, q.weights});
  std::vector<float> packed_rows;
  auto packed_losses = (*model)->loss_and_gradients_packed(in, packed, &packed_rows);
  ASSERT_TRUE(packed_losses.ok()) << packed_losses.status();

  ASSERT_EQ(packed_losses->size(), seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s)
    EXPECT_NEAR((*packed_losses)[s], losses[s], bound.row * std::fabs(losses[s])) << "seq " << s;
  ASSERT_EQ(packed_rows.size(), all_rows.size());
  double worst_row = 0;
  for (size_t r = 0; r < all_rows.size(); ++r) {
    EXPECT_NEAR(packed_rows[r], all_rows[r], bound.row * std::fabs(all_rows[r]) + 1e-6)
        << "row " << r;
    if (all_rows[r] != 0)
      worst_row = std::max(worst_row, std::fabs(packed_rows[r] / all_rows[r] - 1.0));
  }

  ASSERT_EQ(packed.names(), each.names());
  double worst = 0;
  std::string worst_name;
  for (const std::string& name : each.names()) {
    const double r = rel_l2(*packed.find(name), *each.find(name));
    EXPECT_LE(r, bound.grad) << name;
    if (r > worst) worst = r, worst_name = name;
  }
  EXPECT_EQ(packed.expert_counts(), each.expert_counts());
  EXPECT_NEAR(packed.aux_loss(), each.aux_loss(), bound.row * std::fabs(each.aux_loss()));
  if (aux_alpha > 0) {
    EXPECT_FALSE(each.expert_counts().empty());
    EXPECT_GT(each.aux_loss(), 0);
  }
  std::printf("[packed] %s%s%s: %zu gradients, worst rel L2 %.3g (%s), worst row loss %.3g\n",
              fixture.c_str(), weighted ? " (row weights)" : "", aux_alpha > 0 ? " (aux loss)" : "",
              each.names().size(), worst, worst_name.c_str(), worst_row);
}

// KDA, MLA and MoE (softmax router); KDA and GQA with Block AttnRes; GDN, gated GQA and MoE with a
// shared-expert gate; MLA with q LoRA and a sigmoid router with a selection bias.
TEST(PackedTraining, MatchesThePerSequenceCalls) {
  for (const char* f : {"kimi_linear_s0", "fla_kda_s0", "qwen3_next_s0", "deepseek_v3_s1"})
    expect_packed_matches(f, /*weighted=*/false, /*aux_alpha=*/0.0f);
}

// Each sequence's auxiliary load-balancing loss is its own (load statistics over its rows).
TEST(PackedTraining, MatchesWithTheAuxiliaryLoss) {
  for (const char* f : {"kimi_linear_s0", "deepseek_v3_s1"})
    expect_packed_matches(f, /*weighted=*/false, /*aux_alpha=*/0.01f);
}

TEST(PackedTraining, MatchesWithRowWeights) {
  expect_packed_matches("kimi_linear_s0", /*weighted=*/true, /*aux_alpha=*/0.0f);
}

TEST(PackedTraining, OneSequenceIsTheSingleCallExactly) {
  auto model = Model::load(loom::testing::kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Seq> seqs = random_sequences({45}, (*model)->config().vocab_size, false);
  Gradients a, b;
  auto single = (*model)->loss_and_gradients(seqs[0].tokens, a);
  const TrainingSequence one{seqs[0].tokens};
  auto packed = (*model)->loss_and_gradients_packed({&one, 1}, b);
  ASSERT_TRUE(single.ok() && packed.ok());
  EXPECT_EQ((*packed)[0], *single);
  for (const std::string& name : a.names())
    EXPECT_EQ(rel_l2(*b.find(name), *a.find(name)), 0.0) << name;
}

TEST(PackedTraining, RefusesBadSequencesNamingThem) {
  auto model = Model::load(loom::testing::kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(model.ok()) << model.status();
  Gradients g;
  auto none = (*model)->loss_and_gradients_packed({}, g);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> ok = {5, 6, 7, 8}, lone = {9};
  const std::vector<uint8_t> short_mask = {1, 1};
  const std::vector<TrainingSequence> nothing = {{ok}, {lone}};
  auto r = (*model)->loss_and_gradients_packed(nothing, g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sequence 1"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("nothing to predict"), std::string::npos) << r.status();
  const std::vector<TrainingSequence> masked = {{ok, short_mask}, {ok}};
  r = (*model)->loss_and_gradients_packed(masked, g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sequence 0: a loss mask of 2 entries"), std::string::npos)
      << r.status();
}

// TrainStep on MQAR batches of unequal lengths (a budget that splits each batch into passes of
// several examples and one alone) against one example per pass: the same losses, row statistics
// and updated weights up to summation order. The weights after three AdamW steps differ by up to
// 9.4e-6 relative L2 (measured; Adam divides each gradient by its own scale, so an entry's noise
// is not damped by a small gradient) and the row losses of the steps that follow by 1.1e-5.
TEST(PackedTraining, TrainStepPacksTheSameUpdate) {
  const std::string dir = loom::testing::kFixtures + "/kimi_linear_s0";
  auto run = [&](int64_t budget) {
    auto model = Model::load(dir, Placement{.trainable = true});
    EXPECT_TRUE(model.ok()) << model.status();
    OptimizerOptions opt;
    opt.lr = {.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 1, .total_steps = 3};
    opt.max_tokens_per_pass = budget;
    auto step = TrainStep::create(**model, opt);
    EXPECT_TRUE(step.ok()) << step.status();
    std::mt19937_64 rng(5);
    std::vector<StepStats> stats;
    for (int s = 0; s < 3; ++s) {
      std::vector<Example> batch;
      for (int i = 0; i < 5; ++i) {
        MqarOptions task;
        task.num_pairs = 2 + i;
        task.seq_len = 20 + 7 * i;
        task.num_keys = 32;
        task.value_begin = 33;
        task.num_values = 32;
        EXPECT_TRUE(task.validate().ok());
        batch.push_back(make_mqar(task, rng));
      }
      auto st = step->run(batch);
      EXPECT_TRUE(st.ok()) << st.status();
      stats.push_back(*st);
    }
    std::vector<std::pair<std::string, Tensor>> weights;
    for (const auto& e : (*model)->parameters().entries())
      weights.emplace_back(e.name, e.tensor.clone());
    return std::pair{stats, weights};
  };
  const auto [each, each_w] = run(0);
  const auto [packed, packed_w] = run(100);  // passes of 20+27+34, 41+48, then 55 alone
  for (size_t s = 0; s < each.size(); ++s) {
    EXPECT_NEAR(packed[s].loss, each[s].loss, kLossBound * each[s].loss) << "step " << s;
    EXPECT_NEAR(packed[s].grad_norm, each[s].grad_norm, 1e-4 * each[s].grad_norm);
    EXPECT_EQ(packed[s].tokens, each[s].tokens);
    EXPECT_EQ(packed[s].position_scored, each[s].position_scored);
    ASSERT_EQ(packed[s].position_loss.size(), each[s].position_loss.size());
    for (size_t t = 0; t < each[s].position_loss.size(); ++t)
      EXPECT_NEAR(packed[s].position_loss[t], each[s].position_loss[t],
                  5e-5 * std::fabs(each[s].position_loss[t]) + 1e-6);
  }
  double worst = 0;
  for (size_t i = 0; i < each_w.size(); ++i) {
    const double r = rel_l2(packed_w[i].second, each_w[i].second);
    EXPECT_LE(r, 5e-5) << each_w[i].first;
    worst = std::max(worst, r);
  }
  std::printf("[packed] TrainStep: 3 steps, losses %.7f / %.7f, worst weight rel L2 %.3g\n",
              packed.back().loss, each.back().loss, worst);
}

std::vector<double> losses_in(const std::string& run) {
  std::vector<double> out;
  std::ifstream f(fs::path(run) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line)["loss"].get<double>());
  return out;
}

// A whole `loom-trainer train` run (MQAR on kimi_linear_s0's config, random weights) with the
// default budget against "max_tokens_per_pass": 0.
TEST(PackedTraining, ARunGivesTheSameLosses) {
  auto run_json = [](const std::string& out, json budget) {
    json j = {
        {"model",
         {{"config", loom::testing::kFixtures + "/kimi_linear_s0/config.json"}, {"seed", 3}}},
        {"data",
         {{"task", "mqar"},
          {"seq_len", 40},
          {"mqar", {{"num_pairs", 4}, {"num_keys", 32}, {"value_begin", 33}, {"num_values", 32}}}}},
        {"batch_size", 4},
        {"steps", 4},
        {"optimizer", {{"peak_lr", 1e-3}, {"min_lr", 1e-4}, {"warmup_steps", 1}}},
        {"out", out},
        {"seed", 5}};
    if (!budget.is_null()) j["max_tokens_per_pass"] = budget;
    return j;
  };
  auto config = [&](const std::string& out, json budget) {
    auto c = parse_run_config(run_json(out, budget).dump());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : RunConfig{};
  };
  const std::string base =
      std::string(LOOM_TEST_TMPDIR) + "/packed_run." + std::to_string(::getpid());
  const RunConfig packed = config(base + ".packed", nullptr);
  EXPECT_EQ(packed.optimizer.max_tokens_per_pass, OptimizerOptions{}.max_tokens_per_pass);
  const RunConfig each = config(base + ".each", 0);
  EXPECT_EQ(each.optimizer.max_tokens_per_pass, 0);
  ASSERT_TRUE(run_training(packed, nullptr).ok());
  ASSERT_TRUE(run_training(each, nullptr).ok());
  const std::vector<double> a = losses_in(packed.out), b = losses_in(each.out);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], kLossBound * b[i]) << "step " << i;
  fs::remove_all(packed.out);
  fs::remove_all(each.out);

  auto refused = parse_run_config(run_json("o", -1).dump());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_tokens_per_pass"), std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace loom
