// ParameterArena (chunked, aligned, named, frozen read-only) and WeightLoader into it: dtypes by
// role, bf16 bytes copied without an f32 round trip, one rounding for f32/FP8 sources, expert
// ranges and slots from per-expert and stacked checkpoints, writable expert slots, and the
// placements this build refuses.
#include "weights/parameter_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "weights/model_config.h"
#include "weights/safetensors.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

TEST(ParameterArena, CarvesAlignedParametersFromFewChunks) {
  ParameterArena arena(Device::kCpu, /*chunk_bytes=*/1 << 20);
  for (int i = 0; i < 100; ++i) {
    Tensor t =
        arena.allocate("p" + std::to_string(i), {3, 7 + i}, i % 2 ? DType::kBF16 : DType::kF32);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % ParameterArena::kAlignment, 0u);
    EXPECT_TRUE(t.is_contiguous());
  }
  EXPECT_EQ(arena.num_chunks(), 1u);  // 100 small tensors, one allocation
  // A parameter larger than a chunk gets its own; the next small one a fresh chunk.
  Tensor big = arena.allocate("big", {1 << 19}, DType::kF32);  // 2 MiB
  EXPECT_EQ(arena.num_chunks(), 2u);
  arena.allocate("after", {4}, DType::kF32);
  EXPECT_EQ(arena.num_chunks(), 3u);

  size_t f32 = 0, bf16 = 0;
  for (int i = 0; i < 100; ++i) (i % 2 ? bf16 : f32) += 3 * (7 + i) * (i % 2 ? 2 : 4);
  f32 += (size_t{1} << 19) * 4 + 16;
  EXPECT_EQ(arena.bytes(DType::kF32), f32);
  EXPECT_EQ(arena.bytes(DType::kBF16), bf16);
  EXPECT_EQ(arena.bytes(), f32 + bf16);
  EXPECT_GE(arena.reserved_bytes(), arena.bytes());
  EXPECT_EQ(arena.entries().size(), 102u);
  EXPECT_EQ(arena.entries()[100].name, "big");
  ASSERT_NE(arena.find("p3"), nullptr);
  EXPECT_EQ(arena.find("p3")->shape(), Shape({3, 10}));
  EXPECT_EQ(arena.find("p3")->dtype(), DType::kBF16);
  EXPECT_EQ(arena.find("nope"), nullptr);
}

TEST(ParameterArena, TensorsOutliveTheArena) {
  Tensor t;
  {
    ParameterArena arena(Device::kCpu);
    t = arena.allocate("w", {5}, DType::kF32);
    for (int i = 0; i < 5; ++i) t.data<float>()[i] = float(i);
    arena.freeze();
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.data<float>()[i], float(i));
}

TEST(ParameterArenaDeathTest, ImmutableAfterFreeze) {
  ParameterArena arena(Device::kCpu);
  Tensor t = arena.allocate("w", {16}, DType::kF32);
  t.fill(1.0f);
  arena.freeze();
  EXPECT_EQ(t.data<float>()[3], 1.0f);  // readable
  EXPECT_DEATH(arena.allocate("x", {4}, DType::kF32), "immutable");
  EXPECT_DEATH(t.data<float>()[3] = 2.0f, "");  // read-only pages: the write faults
}

// Parameters allocated stays_writable (a slot placement's experts, rewritten by re-placements)
// come from chunks of their own that freeze() leaves writable; the others still fault.
TEST(ParameterArenaDeathTest, WritableParametersStayWritable) {
  ParameterArena arena(Device::kCpu, /*chunk_bytes=*/1 << 16);
  Tensor frozen = arena.allocate("frozen", {8}, DType::kF32);
  Tensor slots = arena.allocate("slots", {8}, DType::kF32, /*stays_writable=*/true);
  Tensor after = arena.allocate("after", {8}, DType::kF32);
  EXPECT_EQ(arena.num_chunks(), 2u);  // one of each kind
  // The frozen kind keeps filling its own chunk past the writable one.
  EXPECT_EQ(static_cast<char*>(after.raw()) - static_cast<char*>(frozen.raw()),
            static_cast<ptrdiff_t>(ParameterArena::kAlignment));
  arena.freeze();
  slots.data<float>()[3] = 2.0f;
  EXPECT_EQ(slots.data<float>()[3], 2.0f);
  EXPECT_DEATH(after.data<float>()[3] = 2.0f, "");
}

TEST(ParameterArenaDeathTest, NameGivenTwiceAborts) {
  ParameterArena arena(Device::kCpu);
  arena.allocate("w", {4}, DType::kF32);
  EXPECT_DEATH(arena.allocate("w", {4}, DType::kF32), "twice");
}

TEST(WeightDType, ParsesFlagValues) {
  EXPECT_EQ(*parse_weight_dtype("auto"), WeightDType::kAuto);
  EXPECT_EQ(*parse_weight_dtype("f32"), WeightDType::kF32);
  EXPECT_EQ(*parse_weight_dtype("bf16"), WeightDType::kBF16);
  EXPECT_EQ(*parse_weight_dtype("fp8"), WeightDType::kFP8);
  for (const char* bad : {"f16", "FP8", "BF16", ""}) {
    const auto r = parse_weight_dtype(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("auto, f32, bf16 or fp8"), std::string::npos);
  }
}

struct Opened {
  ModelConfig cfg;
  WeightLoader loader;
};
Opened open_fixture(const std::string& name) {
  auto cfg = load_model_config(kFixtures + "/" + name);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  auto w = WeightLoader::open(kFixtures + "/" + name, *cfg);
  EXPECT_TRUE(w.ok()) << w.status();
  return {*cfg, *w};
}

TEST(PlacedLoader, AutoResolvesToTheCheckpointsPrecision) {
  for (const auto& [fixture, want] :
       {std::pair<const char*, WeightDType>{"kimi_linear_b0", WeightDType::kBF16},
        {"qwen3_next_b0", WeightDType::kBF16},
        {"kimi_linear_s0", WeightDType::kF32},
        {"deepseek_v3_fp8", WeightDType::kFP8}}) {
    Opened o = open_fixture(fixture);
    ParameterArena arena(Device::kCpu);
    auto placed = o.loader.placed(arena, {.dtype = WeightDType::kAuto});
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->placement().dtype, want) << fixture;
  }
  ModelConfig cfg = open_fixture("kimi_linear_s0").cfg;
  ParameterArena arena(Device::kCpu);
  EXPECT_EQ(WeightLoader::synthetic(cfg, 1)
                .placed(arena, {.dtype = WeightDType::kAuto})
                ->placement()
                .dtype,
            WeightDType::kF32);
}

// A bf16 checkpoint tensor with a bf16 placement: the arena holds the file's bytes; f32 roles
// widen them exactly.
TEST(PlacedLoader, Bf16CheckpointBytesAreCopiedAsIs) {
  Opened o = open_fixture("kimi_linear_b0");
  auto ckpt = Checkpoint::open(kFixtures + "/kimi_linear_b0");
  ASSERT_TRUE(ckpt.ok());
  ParameterArena arena(Device::kCpu);
  auto w = o.loader.placed(arena, {.dtype = WeightDType::kBF16});
  ASSERT_TRUE(w.ok());
  const int64_t v = o.cfg.vocab_size, d = o.cfg.hidden_size;
  auto lm = w->load_matrix("lm_head.weight", {v, d});
  ASSERT_TRUE(lm.ok()) << lm.status();
  auto file = ckpt->get("lm_head.weight");
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(lm->dtype(), DType::kBF16);
  ASSERT_EQ(file->dtype(), DType::kBF16);
  EXPECT_EQ(std::memcmp(lm->raw(), file->raw(), file->nbytes()), 0);
  EXPECT_EQ(arena.find("lm_head.weight")->raw(), lm->raw());
  // The same tensor in an f32 role (a second name: the arena keeps one entry per name).
  auto norm = w->load("final_norm.weight", {d});
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->dtype(), DType::kF32);
  auto norm_file = ckpt->get("model.norm.weight");
  ASSERT_TRUE(norm_file.ok());
  for (int64_t i = 0; i < d; ++i)
    ASSERT_EQ(norm->data<float>()[i], bf16_to_f32(norm_file->data<uint16_t>()[i]));
}

// Every bf16 value the placed loader gives equals the f32 load of the same tensor rounded once:
// for bf16 sources (exact, through an adapter transform: qwen3_next regroups rows), for f32
// sources, and for FP8 sources (the dequantized f32 product, rounded to bf16; its scale never).
TEST(PlacedLoader, Bf16IsTheF32ValueRoundedOnce) {
  struct Case {
    const char* fixture;
    const char* name;
  };
  for (const Case c : {Case{"qwen3_next_b0", "layers.0.gdn.qkvz_proj.weight"},
                       Case{"qwen3_next_b0", "layers.3.gqa.q_proj.weight"},
                       Case{"kimi_linear_s0", "layers.0.kda.qkv_proj.weight"},
                       Case{"deepseek_v3_fp8", "layers.0.mla.q_b_proj.weight"}}) {
    Opened o = open_fixture(c.fixture);
    auto cfg = o.cfg;
    ParameterArena arena(Device::kCpu);
    auto w = o.loader.placed(arena, {.dtype = WeightDType::kBF16});
    ASSERT_TRUE(w.ok());
    // The shape from the model's own load: take it from an f32 model's arena.
    auto f32_model = Model::load(kFixtures + "/" + c.fixture);
    ASSERT_TRUE(f32_model.ok()) << f32_model.status();
    const Tensor* ref = f32_model->get()->parameters().find(c.name);
    ASSERT_NE(ref, nullptr) << c.name;
    ASSERT_EQ(ref->dtype(), DType::kF32);
    auto got = w->load_matrix(c.name, ref->shape());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->dtype(), DType::kBF16);
    int64_t differ = 0;
    for (int64_t i = 0; i < ref->numel(); ++i)
      differ += got->data<uint16_t>()[i] != f32_to_bf16(ref->data<float>()[i]);
    EXPECT_EQ(differ, 0) << c.fixture << " " << c.name;
  }
}

// Experts [2, 5) of 8: per-expert checkpoint tensors (only those experts are read) and a stacked
// native tensor (only those rows copied) both give the rows of the whole load.
TEST(PlacedLoader, ExpertRangeFromPerExpertAndStackedCheckpoints) {
  Opened o = open_fixture("kimi_linear_b0");
  const int64_t e = o.cfg.moe.num_experts, i = o.cfg.moe.intermediate_size, d = o.cfg.hidden_size;
  ASSERT_EQ(e, 8);
  const std::string name = "layers.1.moe.experts.down";
  auto whole = o.loader.load(name, {e, d, i});
  ASSERT_TRUE(whole.ok()) << whole.status();

  // A native checkpoint storing the layer's experts as one [E, D, I] tensor.
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/parameter_arena_stacked";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", {{name, *whole}}).ok());
  ModelConfig native = o.cfg;
  native.model_type = "loom";
  auto stacked = WeightLoader::open(dir, native);
  ASSERT_TRUE(stacked.ok()) << stacked.status();

  for (const WeightLoader* src : {&o.loader, &*stacked}) {
    for (WeightDType dt : {WeightDType::kF32, WeightDType::kBF16}) {
      ParameterArena arena(Device::kCpu);
      auto w = src->placed(arena, {.dtype = dt, .experts = ExpertRange{2, 5}});
      ASSERT_TRUE(w.ok()) << w.status();
      auto part = w->load_experts(name, {e, d, i});
      ASSERT_TRUE(part.ok()) << part.status();
      ASSERT_EQ(part->shape(), Shape({3, d, i}));
      EXPECT_EQ(arena.bytes(), static_cast<size_t>(3 * d * i) * (dt == WeightDType::kBF16 ? 2 : 4));
      const float* want = whole->data<float>() + 2 * d * i;
      for (int64_t j = 0; j < 3 * d * i; ++j) {
        const float got = dt == WeightDType::kBF16 ? bf16_to_f32(part->data<uint16_t>()[j])
                                                   : part->data<float>()[j];
        ASSERT_EQ(got, want[j]) << j;
      }
    }
  }
}

// A slot placement: slot s holds expert slots[s] (repeats and any order), from per-expert and
// stacked checkpoints alike, the same values as the whole load's rows.
TEST(PlacedLoader, ExpertSlotsFromPerExpertAndStackedCheckpoints) {
  Opened o = open_fixture("kimi_linear_b0");
  const int64_t e = o.cfg.moe.num_experts, i = o.cfg.moe.intermediate_size, d = o.cfg.hidden_size;
  const std::string name = "layers.1.moe.experts.gate";
  auto whole = o.loader.load(name, {e, i, d});
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/parameter_arena_slots";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", {{name, *whole}}).ok());
  ModelConfig native = o.cfg;
  native.model_type = "loom";
  auto stacked = WeightLoader::open(dir, native);
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  const std::vector<int32_t> slots = {1, 2, 3, 3, 7, 0};
  for (const WeightLoader* src : {&o.loader, &*stacked}) {
    ParameterArena arena(Device::kCpu);
    auto w = src->placed(arena, {.dtype = WeightDType::kBF16, .expert_slots = slots});
    ASSERT_TRUE(w.ok()) << w.status();
    auto part = w->load_experts(name, {e, i, d});
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_EQ(part->shape(), Shape({6, i, d}));
    EXPECT_EQ(arena.bytes(), static_cast<size_t>(6 * i * d * 2));
    for (size_t s = 0; s < slots.size(); ++s)
      for (int64_t j = 0; j < i * d; ++j)
        ASSERT_EQ(bf16_to_f32(part->data<uint16_t>()[s * i * d + j]),
                  whole->data<float>()[slots[s] * i * d + j])
            << "slot " << s << " element " << j;
  }
}

TEST(PlacedLoader, RefusesPlacementsItCannotHonour) {
  Opened o = open_fixture("kimi_linear_b0");
  auto message = [&](const Placement& p, Device arena_device = Device::kCpu) {
    ParameterArena arena(arena_device);
    auto w = o.loader.placed(arena, p);
    EXPECT_FALSE(w.ok()) << p.describe();
    return w.ok() ? std::string() : std::string(w.status().message());
  };
  EXPECT_NE(message({}, Device::kCuda).find("arena is on cuda:0"), std::string::npos);
  for (ExpertRange r :
       {ExpertRange{3, 3}, ExpertRange{-1, 2}, ExpertRange{6, 9}, ExpertRange{5, 2}})
    EXPECT_NE(message({.experts = r}).find("not a non-empty range of the model's 8 experts"),
              std::string::npos)
        << r.begin << ", " << r.end;
  EXPECT_NE(message({.expert_slots = {0, 8}}).find("slot of expert 8"), std::string::npos);
  EXPECT_NE(message({.expert_slots = {0, 1}, .trainable = true}).find("for serving"),
            std::string::npos);
  EXPECT_NE(message({.experts = ExpertRange{0, 2}, .expert_slots = {0, 1}}).find("not both"),
            std::string::npos);
  Opened dense = open_fixture("fla_kda_s0");
  ParameterArena arena(Device::kCpu);
  auto w = dense.loader.placed(arena, {.experts = ExpertRange{0, 1}});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("no routed experts"), std::string::npos);
  ParameterArena arena2(Device::kCpu);
  auto w2 = dense.loader.placed(arena2, {.expert_slots = {0}});
  ASSERT_FALSE(w2.ok());
  EXPECT_NE(w2.status().message().find("no routed experts"), std::string::npos);
  // A device this build or machine does not have: Model::load says which, before loading.
  auto m = Model::load(kFixtures + "/kimi_linear_b0", Placement{.device = Device::cuda(999)});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("device cuda:999"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace loom
