// Data-parallel training on GPUs (run.data_parallel on CUDA: rank r on GPU r over NCCL) against
// the one-GPU run of the same batches, the oracle: kimi_linear_s0's config (KDA, MLA, a biased
// MoE router), MQAR, 3 steps. Step 1's loss and gradient norm within f32 summation noise, step 1's
// routing (expert counts summed over the ranks) the same, one metrics file (rank 0's), final
// weights within 1e-3 relative L2 (AdamW turns near-zero gradient elements into lr-sized steps
// whose sign follows the summation order; data_parallel_test finds 4e-4 on the CPU). With one
// GPU, the two-rank run is refused naming the missing device.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "nlohmann/json.hpp"
#include "tests/gpu/model_test_support.h"
#include "trainer/run_config.h"
#include "trainer/train_run.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() /
          ("trainer_dp_cuda." + std::to_string(::getpid()) + "." + name))
      .string();
}

json run(const std::string& out, int ranks) {
  return {
      {"model", {{"config", fixtures_dir() + "/kimi_linear_s0/config.json"}, {"seed", 3}}},
      {"data",
       {{"task", "mqar"},
        {"seq_len", 24},
        {"mqar", {{"num_pairs", 4}, {"num_keys", 64}, {"value_begin", 65}, {"num_values", 64}}}}},
      {"batch_size", 4},
      {"steps", 3},
      {"optimizer", {{"peak_lr", 3e-3}, {"min_lr", 3e-3}, {"warmup_steps", 1}}},
      {"device", "cuda"},
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

TEST(TrainerDataParallelCuda, TwoGpusTrainAsOne) {
  if (!fs::exists(fixtures_dir() + "/kimi_linear_s0/config.json"))
    GTEST_SKIP() << "no kimi_linear_s0 fixture in " << fixtures_dir();
  const std::string one = tmp("one"), two = tmp("two");
  auto single = parse_run_config(run(one, 1).dump());
  auto pair = parse_run_config(run(two, 2).dump());
  ASSERT_TRUE(single.ok() && pair.ok());
  if (cuda::visible_devices() < 2) {
    const auto refused = run_training(*pair, nullptr);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(std::string(refused.status().message()).find("cuda:1"), std::string::npos)
        << refused.status();
    GTEST_SKIP() << "one GPU: the two-rank run is refused (" << refused.status().message() << ")";
  }
  auto a = run_training(*single, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = run_training(*pair, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<json> ma = metrics_of(one), mb = metrics_of(two);
  ASSERT_EQ(ma.size(), 3u);
  ASSERT_EQ(mb.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    std::printf("step %zu: loss %.9g / %.9g, grad norm %.9g / %.9g (one GPU / two)\n", i + 1,
                ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>(),
                ma[i]["grad_norm"].get<double>(), mb[i]["grad_norm"].get<double>());
  EXPECT_NEAR(mb[0]["loss"].get<double>(), ma[0]["loss"].get<double>(),
              1e-6 * ma[0]["loss"].get<double>());
  EXPECT_NEAR(mb[0]["grad_norm"].get<double>(), ma[0]["grad_norm"].get<double>(),
              1e-5 * ma[0]["grad_norm"].get<double>());
  for (size_t i = 1; i < 3; ++i)
    EXPECT_NEAR(mb[i]["loss"].get<double>(), ma[i]["loss"].get<double>(),
                1e-4 * ma[i]["loss"].get<double>());
  ASSERT_EQ(mb[0]["routing"].size(), ma[0]["routing"].size());
  for (size_t l = 0; l < ma[0]["routing"].size(); ++l)
    EXPECT_EQ(mb[0]["routing"][l]["load_entropy"], ma[0]["routing"][l]["load_entropy"]);
  auto wa = Model::load(a->last_checkpoint, {.dtype = WeightDType::kF32});
  auto wb = Model::load(b->last_checkpoint, {.dtype = WeightDType::kF32});
  ASSERT_TRUE(wa.ok() && wb.ok());
  double worst = 0;
  for (const ParameterArena::Entry& e : (*wa)->parameters().entries()) {
    const Tensor* other = (*wb)->parameters().find(e.name);
    ASSERT_NE(other, nullptr) << e.name;
    worst = std::max(worst, rel_l2_or_abs(*other, e.tensor));
  }
  std::printf("two GPUs against one after 3 steps: worst weight rel L2 %.3g\n", worst);
  EXPECT_LT(worst, 1e-3);
  fs::remove_all(one);
  fs::remove_all(two);
}

}  // namespace
}  // namespace loom
