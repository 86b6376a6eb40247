// Data-parallel training (trainer/data_parallel.h) on CPU ranks: the run config's data_parallel
// and its mistakes; a two-rank run of kimi_linear_s0 (KDA, MLA, a biased MoE router) against the
// one-rank run of the same batches, the oracle: the same first-step loss and routing (its expert
// counts are summed over the ranks), losses and final weights that stay within f32 summation
// noise after, and one metrics file and checkpoint written (by rank 0); a two-rank run resumed
// from its checkpoint repeats the uninterrupted one exactly.
#include "trainer/data_parallel.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/parallel/thread_communicator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine_test_support.h"
#include "trainer/run_config.h"
#include "trainer/train_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tmp(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/data_parallel." + std::to_string(::getpid()) + "." +
         name;
}

json run(const std::string& out, int ranks) {
  return {
      {"model",
       {{"config", loom::testing::kFixtures + "/kimi_linear_s0/config.json"}, {"seed", 3}}},
      {"data",
       {{"task", "mqar"},
        {"seq_len", 24},
        {"mqar", {{"num_pairs", 4}, {"num_keys", 64}, {"value_begin", 65}, {"num_values", 64}}}}},
      {"batch_size", 4},
      {"steps", 3},
      {"optimizer", {{"peak_lr", 3e-3}, {"min_lr", 3e-3}, {"warmup_steps", 1}}},
      {"out", out},
      {"seed", 5},
      {"data_parallel", ranks}};
}

std::vector<json> metrics_of(const std::string& dir) {
  std::vector<json> out;
  std::ifstream f(fs::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double{a.data<float>()[i]} - b.data<float>()[i];
    num += d * d;
    den += double{b.data<float>()[i]} * b.data<float>()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

TEST(DataParallel, RunConfig) {
  auto message_of = [](const json& j) {
    return std::string(parse_run_config(j.dump()).status().message());
  };
  EXPECT_EQ(parse_run_config(run("/tmp/x", 2).dump())->data_parallel, 2);
  json j = run("/tmp/x", 1);
  j.erase("data_parallel");
  EXPECT_EQ(parse_run_config(j.dump())->data_parallel, 1);
  EXPECT_NE(message_of(run("/tmp/x", 0)).find("run.data_parallel"), std::string::npos);
  EXPECT_NE(message_of(run("/tmp/x", 65)).find("run.data_parallel"), std::string::npos);
  const std::string uneven = message_of(run("/tmp/x", 3));
  EXPECT_NE(uneven.find("not a multiple of 3 ranks"), std::string::npos) << uneven;
  j = run("/tmp/x", 2);
  j["device"] = "cuda:1";
  EXPECT_NE(message_of(j).find("devices 0..N-1"), std::string::npos) << message_of(j);
  j["device"] = "cuda";
  EXPECT_TRUE(parse_run_config(j.dump()).ok());
}

TEST(DataParallel, RankShares) {
  EXPECT_EQ(rank_share(8, 0, 2).begin, 0u);
  EXPECT_EQ(rank_share(8, 0, 2).end, 4u);
  EXPECT_EQ(rank_share(8, 1, 2).begin, 4u);
  EXPECT_EQ(rank_share(8, 1, 2).end, 8u);
  EXPECT_EQ(rank_share(6, 2, 3).begin, 4u);
  EXPECT_EQ(rank_share(1, 0, 1).end, 1u);
}

// Both collectives over three CPU ranks: the sums in rank order, the same on every rank.
TEST(DataParallel, Collectives) {
  std::vector<std::vector<float>> flat_after(3);
  std::vector<std::vector<double>> sums(3);
  const absl::Status ok = run_thread_ranks(3, absl::Seconds(30), [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor flat = Tensor::empty({6});
    for (int i = 0; i < 6; ++i) flat.data<float>()[i] = static_cast<float>(10 * r + i);
    Tensor part;
    if (absl::Status s = all_reduce_sum(comm, flat, part); !s.ok()) return s;
    flat_after[r].assign(flat.data<float>(), flat.data<float>() + 6);
    const std::vector<double> mine = {0.5 * r, 1e-3 + r};
    absl::StatusOr<std::vector<double>> sum = sum_over_ranks(comm, mine, Device::kCpu);
    if (!sum.ok()) return sum.status();
    sums[r] = *sum;
    Tensor odd = Tensor::empty({5});  // not a multiple of the ranks
    return all_reduce_sum(comm, odd, part).ok()
               ? absl::InternalError("an f32 [5] block over 3 ranks was summed")
               : absl::OkStatus();
  });
  ASSERT_TRUE(ok.ok()) << ok;
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) EXPECT_EQ(flat_after[r][i], 30.0f + 3 * i) << r << " " << i;
    EXPECT_EQ(sums[r][0], 0.0 + 0.5 + 1.0);
    EXPECT_EQ(sums[r][1], (1e-3 + 0) + (1e-3 + 1) + (1e-3 + 2));
  }
}

TEST(DataParallel, TwoRanksTrainAsOne) {
  const std::string one = tmp("one"), two = tmp("two");
  fs::remove_all(one);
  fs::remove_all(two);
  auto single = parse_run_config(run(one, 1).dump());
  auto pair = parse_run_config(run(two, 2).dump());
  ASSERT_TRUE(single.ok() && pair.ok());
  auto a = run_training(*single, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = run_training(*pair, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->steps, 3);
  const std::vector<json> ma = metrics_of(one), mb = metrics_of(two);
  ASSERT_EQ(ma.size(), 3u);
  ASSERT_EQ(mb.size(), 3u);  // rank 0 alone writes
  for (size_t i = 0; i < 3; ++i) {
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    // Step 1 runs the same weights on the same examples: only the order of the sums differs. Later
    // steps start from weights that AdamW moved by lr where a gradient element is near zero and
    // its sign follows the summation order, so they only stay close.
    std::printf("step %zu: loss %.9g / %.9g, grad norm %.9g / %.9g (one rank / two)\n", i + 1, la,
                lb, ma[i]["grad_norm"].get<double>(), mb[i]["grad_norm"].get<double>());
    EXPECT_NEAR(lb, la, (i == 0 ? 1e-6 : 1e-4) * std::fabs(la)) << "step " << i + 1;
    EXPECT_EQ(mb[i]["tokens"], ma[i]["tokens"]);
    EXPECT_NEAR(mb[i]["grad_norm"].get<double>(), ma[i]["grad_norm"].get<double>(),
                (i == 0 ? 1e-5 : 1e-2) * ma[i]["grad_norm"].get<double>())
        << "step " << i + 1;
  }
  // Step 1's routing: counts summed over the ranks are the single rank's counts.
  ASSERT_TRUE(ma[0].contains("routing"));
  ASSERT_EQ(mb[0]["routing"].size(), ma[0]["routing"].size());
  for (size_t l = 0; l < ma[0]["routing"].size(); ++l) {
    EXPECT_EQ(mb[0]["routing"][l]["load_entropy"], ma[0]["routing"][l]["load_entropy"]);
    EXPECT_EQ(mb[0]["routing"][l]["max_violation"], ma[0]["routing"][l]["max_violation"]);
  }
  auto wa = Model::load(a->last_checkpoint, {.dtype = WeightDType::kF32});
  auto wb = Model::load(b->last_checkpoint, {.dtype = WeightDType::kF32});
  ASSERT_TRUE(wa.ok() && wb.ok());
  double worst = 0;
  for (const ParameterArena::Entry& e : (*wa)->parameters().entries()) {
    const Tensor* other = (*wb)->parameters().find(e.name);
    ASSERT_NE(other, nullptr) << e.name;
    worst = std::max(worst, rel_l2(*other, e.tensor));
  }
  std::printf("two ranks against one after 3 steps: worst weight rel L2 %.3g\n", worst);
  EXPECT_LT(worst, 1e-3);
  fs::remove_all(one);
  fs::remove_all(two);
}

// A two-rank run resumed from its step-2 checkpoint repeats the uninterrupted run's steps 3 and 4
// exactly (every rank restores the same weights, moments and data position).
TEST(DataParallel, ResumesExactly) {
  const std::string whole = tmp("whole"), rest = tmp("rest");
  fs::remove_all(whole);
  fs::remove_all(rest);
  json j = run(whole, 2);
  j["steps"] = 4;
  j["checkpoint_every"] = 2;
  auto a = run_training(*parse_run_config(j.dump()), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  json r = run(rest, 2);
  r["model"] = {{"checkpoint", (fs::path(whole) / "checkpoint-2").string()}};
  r["steps"] = 2;
  r["optimizer"]["total_steps"] = 4;
  auto b = run_training(*parse_run_config(r.dump()), nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<json> ma = metrics_of(whole), mb = metrics_of(rest);
  ASSERT_EQ(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(mb[i]["loss"].get<double>(), ma[2 + i]["loss"].get<double>()) << "step " << 3 + i;
    EXPECT_EQ(mb[i]["grad_norm"].get<double>(), ma[2 + i]["grad_norm"].get<double>());
  }
  fs::remove_all(whole);
  fs::remove_all(rest);
}

}  // namespace
}  // namespace loom
