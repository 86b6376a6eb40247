// The hybrid prefix cache on the GPU (issue 15): attention pages and linear-state checkpoints in
// their separate pools, a hit restoring both, for hits at a checkpoint that an earlier prefill
// passed by 1 to 10 tokens (tests/unit/prefix_boundary_scenario.h: the scenario, shared with the
// CPU's engine_prefix_boundary_test, and why). Every fixture family runs (KDA + MLA, GDN + gated
// GQA, MLA only, KDA with Block AttnRes) in f32, and the bf16 checkpoints in bf16 activations.
// Each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for run.sh's table.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/launch.h"
#include "kernels/exec.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/model_test_support.h"
#include "tests/unit/prefix_boundary_scenario.h"

namespace loom {
namespace {

void check(const std::string& name, double err, double bound) {
  const bool pass = err <= bound;
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, bound, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, bound) << name;
}

class PrefixCacheCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheCuda, HitsPastACheckpointChangeNothing) {
  const std::string dir = fixtures_dir() + "/" + GetParam();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no fixture " << dir;
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  auto load = [&] {
    auto m = Model::load(dir, Placement{.device = Device::kCuda, .dtype = WeightDType::kAuto});
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(m).value();
  };
  std::mt19937_64 rng(gpu_test_seed() + 11);
  int64_t vocab = 0;
  {
    auto probe = load();
    vocab = probe->config().vocab_size;
    std::printf("GPUINFO %s: %s activations\n", GetParam(),
                probe->act_dtype() == DType::kBF16 ? "bf16" : "f32");
  }
  auto ids = [&](int64_t n) { return random_ids(n, vocab, rng); };
  const PrefixBoundaryResult r = run_prefix_boundary_scenario(load, ids, GetParam());
  check(std::string(GetParam()) + "_prefix_hit_past_boundary_differences",
        static_cast<double>(r.worst_differences), 0);
  check(std::string(GetParam()) + "_prefix_hit_tokens_short_of_64",
        static_cast<double>(std::max<int64_t>(0, 64 - r.min_hit_tokens)), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheCuda,
                         ::testing::Values("kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1",
                                           "fla_kda_s0", "kimi_linear_b0", "qwen3_next_b0"));

}  // namespace
}  // namespace loom
