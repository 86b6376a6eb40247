// Prefix hits at a linear-state checkpoint that an earlier prefill passed by 1 to 10 tokens, on
// the CPU, every fixture family (tests/unit/prefix_boundary_scenario.h says why these cases). The
// GPU runs the same scenario (tests/gpu/model_prefix_cache_cuda_test.cc).
#include <random>
#include <string>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "tests/unit/prefix_boundary_scenario.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

class PrefixBoundary : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixBoundary, HitsPastACheckpointChangeNothing) {
  const std::string dir = kFixtures + "/" + GetParam();
  std::mt19937_64 rng(20261201);
  auto load = [&] {
    auto m = Model::load(dir);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(m).value();
  };
  auto ids = [&](int64_t n) {
    std::uniform_int_distribution<int32_t> d(3, 299);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = d(rng);
    return p;
  };
  const PrefixBoundaryResult r = run_prefix_boundary_scenario(load, ids, GetParam());
  EXPECT_EQ(r.worst_differences, 0u);
  EXPECT_GE(r.min_hit_tokens, 64) << "every request B must hit the checkpoint at 64";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixBoundary,
                         ::testing::Values("kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1",
                                           "fla_kda_s0"));

}  // namespace
}  // namespace loom
