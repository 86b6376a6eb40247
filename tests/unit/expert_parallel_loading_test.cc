// Expert-parallel ranks load only their experts (issue 16, item 5): with the load balancer each
// thread rank loads the model with Placement::expert_slots = its slots and must then hold exactly
// those experts, slot by slot the same bits as a model loaded with every expert (the oracle), from
// the fixture's own checkpoint and from a sharded copy of it (experts spread over three shard
// files with an index); the expert bytes divide as the slots do; and a checkpoint missing an
// expert fails the load of exactly the ranks that hold it, naming the tensor. Whole-model outputs
// over such ranks, with re-placements moving weights between them, are checked against one rank
// in expert_parallel_model_test.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fp8_matrix.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "engine/parallel/expert_load_balancer.h"
#include "engine/parallel/expert_parallel_dispatcher.h"
#include "engine/parallel/expert_weight_transfer.h"
#include "engine/parallel/thread_communicator.h"
#include "tests/unit/sharded_checkpoint_test_support.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = LOOM_FIXTURES_DIR;
const std::string kTmp = LOOM_TEST_TMPDIR;

// One thread rank's load with the balancer: its slots, and its model or the load's error.
struct RankLoad {
  std::vector<int32_t> slots;
  absl::Status status;
  std::unique_ptr<Model> model;
};

std::vector<RankLoad> load_ranks(const std::string& dir, int ranks,
                                 const ExpertBalanceOptions& options,
                                 WeightDType dtype = WeightDType::kF32) {
  auto cfg = load_model_config(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  const int moe_layers =
      static_cast<int>(std::count(cfg->ffns.begin(), cfg->ffns.end(), FfnType::kMoe));
  std::vector<RankLoad> out(ranks);
  const absl::Status st =
      run_thread_ranks(ranks, absl::Seconds(60), [&](Communicator& comm) -> absl::Status {
        ExpertLoadBalancer balancer(comm, moe_layers, cfg->moe.num_experts, options);
        RankLoad& mine = out[comm.rank()];
        mine.slots = balancer.load_slots();
        const ScopedExpertDispatcher bind(balancer.dispatcher_factory(ExpertExchange::kAllToAll));
        absl::StatusOr<std::unique_ptr<Model>> model =
            Model::load(dir, *cfg, Placement{.dtype = dtype, .expert_slots = mine.slots});
        mine.status = model.status();
        if (model.ok()) mine.model = *std::move(model);
        return absl::OkStatus();  // the load's error is the rank's result, not the group's
      });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

// Whether row `a` of expert matrix x and row `b` of y hold the same bits (an FP8 matrix's block
// scales too).
bool same_expert(const Tensor& x, int64_t a, const Tensor& y, int64_t b) {
  const int64_t bytes = static_cast<int64_t>(x.nbytes()) / x.dim(0);
  if (x.dtype() != y.dtype() || bytes != static_cast<int64_t>(y.nbytes()) / y.dim(0)) return false;
  if (std::memcmp(static_cast<const char*>(x.raw()) + a * bytes,
                  static_cast<const char*>(y.raw()) + b * bytes, bytes) != 0)
    return false;
  if (x.dtype() != DType::kF8E4M3) return true;
  const Tensor sx = fp8_matrix_scales(x), sy = fp8_matrix_scales(y);
  const int64_t n = sx.numel() / sx.dim(0);
  return std::memcmp(sx.data<float>() + a * n, sy.data<float>() + b * n, n * sizeof(float)) == 0;
}

// The dtype the model's routed experts are stored in.
DType w_dtype(const Model& m) {
  return m.parameters().find("layers.1.moe.experts.gate") != nullptr
             ? m.parameters().find("layers.1.moe.experts.gate")->dtype()
             : m.parameters().find("layers.0.moe.experts.gate")->dtype();
}

// Each rank's slots of `fixture` (and of its sharded copy) against the one-rank load with every
// expert, in matrices of `dtype`.
void check_slots(const std::string& fixture, const std::string& sharded, WeightDType dtype) {
  auto full = Model::load(fixture, Placement{.dtype = dtype});  // every expert: the oracle
  ASSERT_TRUE(full.ok()) << full.status();
  const ModelConfig& cfg = (*full)->config();
  const int64_t e = cfg.moe.num_experts;
  auto full_layers = find_expert_slot_weights((*full)->parameters(), cfg);
  ASSERT_TRUE(full_layers.ok()) << full_layers.status();
  const size_t full_bytes = expert_weight_bytes((*full)->parameters());

  struct Config {
    int ranks;
    ExpertBalanceOptions options;
  };
  for (const Config& c : {Config{2, {.redundant_experts = 2, .interval_steps = 1}},
                          Config{3, {.redundant_experts = 4, .interval_steps = 2}},
                          Config{3, {.redundant_experts = 0, .interval_steps = 1}}}) {
    for (const std::string& dir : {fixture, sharded}) {
      SCOPED_TRACE(testing::Message()
                   << dir << ", N " << c.ranks << ", K " << c.options.redundant_experts << ", "
                   << weight_dtype_name(dtype) << " matrices");
      const std::vector<RankLoad> ranks = load_ranks(dir, c.ranks, c.options, dtype);
      int64_t slots_total = 0;
      for (size_t r = 0; r < ranks.size(); ++r) {
        ASSERT_TRUE(ranks[r].status.ok()) << "rank " << r << ": " << ranks[r].status;
        const Model& m = *ranks[r].model;
        const int64_t slots = static_cast<int64_t>(ranks[r].slots.size());
        slots_total += slots;
        auto layers = find_expert_slot_weights(m.parameters(), cfg);
        ASSERT_TRUE(layers.ok()) << layers.status();
        ASSERT_EQ(layers->size(), full_layers->size());
        for (size_t l = 0; l < layers->size(); ++l) {
          const ExpertSlotWeights& w = (*layers)[l];
          const ExpertSlotWeights& all = (*full_layers)[l];
          // Exactly its slots, no other expert.
          ASSERT_EQ(w.gate.dim(0), slots);
          ASSERT_EQ(w.up.dim(0), slots);
          ASSERT_EQ(w.down.dim(0), slots);
          for (int64_t s = 0; s < slots; ++s) {
            const int32_t x = ranks[r].slots[s];
            EXPECT_TRUE(same_expert(w.gate, s, all.gate, x)) << "layer " << l << " slot " << s;
            EXPECT_TRUE(same_expert(w.up, s, all.up, x)) << "layer " << l << " slot " << s;
            EXPECT_TRUE(same_expert(w.down, s, all.down, x)) << "layer " << l << " slot " << s;
          }
        }
        // The rank's expert bytes are the one-rank load's matrices with S slots for E experts
        // (exactly S / E of them but for an FP8 matrix's fixed trailer and padding).
        const size_t bytes = expert_weight_bytes(m.parameters());
        size_t want = 0;
        for (const ExpertSlotWeights& all : *full_layers)
          for (const Tensor* t : {&all.gate, &all.up, &all.down}) {
            Shape shape = t->shape();
            shape[0] = slots;
            want += t->dtype() == DType::kF8E4M3
                        ? fp8_storage_bytes(shape)
                        : static_cast<size_t>(shape.numel()) * dtype_size(t->dtype());
          }
        EXPECT_EQ(bytes, want);
        if (w_dtype(m) != DType::kF8E4M3) {
          EXPECT_EQ(bytes * static_cast<size_t>(e), full_bytes * static_cast<size_t>(slots));
        }
        std::printf("%s %s, %s matrices, N=%d K=%ld rank %zu: %ld slots, %zu of %zu expert bytes\n",
                    cfg.model_type.c_str(), dir == sharded ? sharded.c_str() : fixture.c_str(),
                    std::string(dtype_name(w_dtype(m))).c_str(), c.ranks,
                    static_cast<long>(c.options.redundant_experts), r, static_cast<long>(slots),
                    bytes, full_bytes);
      }
      EXPECT_EQ(slots_total, e + c.options.redundant_experts);
    }
  }
}

class ExpertParallelLoading : public testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelLoading, EachRankHoldsExactlyItsSlots) {
  const std::string fixture = kFixtures + "/" + GetParam();
  const std::string sharded = kTmp + "/ep_sharded_" + GetParam();
  write_sharded_checkpoint(fixture, sharded, -1);
  // f32 matrices, and the checkpoint's own precision (auto: the bf16 bytes of a bf16 checkpoint,
  // the FP8 bytes and block scales of an FP8 one).
  for (const WeightDType dtype : {WeightDType::kF32, WeightDType::kAuto})
    check_slots(fixture, sharded, dtype);
  fs::remove_all(sharded);
}

TEST_P(ExpertParallelLoading, MissingExpertFailsOnlyTheRanksThatHoldIt) {
  const std::string fixture = kFixtures + "/" + GetParam();
  const ExpertBalanceOptions options{.redundant_experts = 2, .interval_steps = 1};
  // Rank 0's slots under the initial placement, to pick an expert only rank 0 holds.
  const std::vector<RankLoad> ok = load_ranks(fixture, 2, options);
  int32_t missing = -1;
  for (const int32_t x : ok[0].slots)
    if (std::find(ok[1].slots.begin(), ok[1].slots.end(), x) == ok[1].slots.end()) missing = x;
  ASSERT_GE(missing, 0);
  const std::string dir = kTmp + "/ep_missing_" + GetParam();
  write_sharded_checkpoint(fixture, dir, missing);
  const std::vector<RankLoad> ranks = load_ranks(dir, 2, options);
  ASSERT_FALSE(ranks[0].status.ok());
  EXPECT_EQ(ranks[0].status.code(), absl::StatusCode::kNotFound) << ranks[0].status;
  const std::string why(ranks[0].status.message());
  std::printf("%s without expert %d: rank 0: %s\n", GetParam().c_str(), missing, why.c_str());
  EXPECT_NE(why.find(absl::StrCat(".experts.", missing, ".")), std::string::npos) << why;
  EXPECT_NE(why.find(absl::StrCat("expert ", missing, ", which this load needs")),
            std::string::npos)
      << why;
  // Rank 1 holds no copy of it and loads.
  EXPECT_TRUE(ranks[1].status.ok()) << ranks[1].status;
  // One rank holding every expert needs it too.
  EXPECT_FALSE(Model::load(dir).ok());
  fs::remove_all(dir);
}

TEST(ExpertParallelLoading, SlotPlacementNeedsADispatcher) {
  const absl::StatusOr<std::unique_ptr<Model>> m =
      Model::load(kFixtures + "/kimi_linear_s0", Placement{.expert_slots = {0, 1, 1, 5}});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("dispatcher"), std::string_view::npos) << m.status();
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ExpertParallelLoading,
                         testing::Values("kimi_linear_s0", "kimi_linear_s1", "kimi_linear_b0",
                                         "qwen3_next_s0", "qwen3_next_b0", "deepseek_v3_s1",
                                         "deepseek_v3_fp8"));

}  // namespace
}  // namespace loom
