// The per-step path of the serving forward allocates nothing once warm and packs its step data
// exactly once per step: ModelRunner keeps one Workspace and one StepData, and after the first
// steps (which size the workspace) every decode step reuses their memory. Counted with
// allocate_buffer's counter and StepData's transfer counter; the logits are also checked against
// a fresh forward over private caches, so the reuse does not change a number.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "engine/model/model.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

void check_decode_steps_allocate_nothing(const std::string& fixture) {
  auto loaded = Model::load(loom::testing::kFixtures + "/" + fixture);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const int vocab = model.config().vocab_size;
  CacheStore::Options opt;
  opt.num_pages = 25;  // the scratch page and 8 for each sequence
  opt.page_size = 16;
  opt.num_slots = 4;
  CacheStore store(model.config(), opt);
  ModelRunner runner(model, store, /*batch_invariant=*/false);
  // The engine's limits: 3 sequences, 128 tokens a step, contexts up to 8 pages.
  runner.reserve(StepShape{/*tokens=*/128, /*seqs=*/3, /*logit_rows=*/3, /*page_cols=*/8});

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  const std::vector<int> prompt_lens = {23, 5, 41};
  BatchPlan plan;
  std::vector<SequenceCache> refs;
  std::vector<std::vector<int32_t>> history(3);
  std::vector<std::vector<int32_t>> tables(3);  // the plan views them, as it views the scheduler's
  int32_t next_page = CacheStore::kScratchPage + 1;
  for (int i = 0; i < 3; ++i) {
    SeqPlan s;
    s.request_id = i;
    s.state_slot = store.has_linear() ? i + 1 : -1;  // slot 0 is scratch
    s.fresh_state = true;
    s.sample = true;
    for (int t = 0; t < prompt_lens[i]; ++t) s.tokens.push_back(tok(rng));
    if (store.has_attention()) {
      for (int p = 0; p < 8; ++p) tables[i].push_back(next_page++);
      s.page_table = tables[i];
    }
    plan.seqs.push_back(s);
    refs.push_back(model.new_cache());
  }
  // Runs the plan (recording every token fed, for the reference), then turns it into the next
  // decode step.
  auto step = [&]() -> Tensor {
    for (int i = 0; i < 3; ++i)
      history[i].insert(history[i].end(), plan.seqs[i].tokens.begin(), plan.seqs[i].tokens.end());
    absl::StatusOr<Tensor> logits = runner.run(plan);
    EXPECT_TRUE(logits.ok()) << logits.status();
    // Next step: one decode token per sequence.
    for (SeqPlan& s : plan.seqs) {
      s.start_pos += static_cast<int32_t>(s.tokens.size());
      s.fresh_state = false;
      s.is_decode = true;
      s.tokens = {tok(rng)};
    }
    return logits.ok() ? *logits : Tensor();
  };
  step();  // prefill: sizes the workspace
  step();
  step();
  const uint64_t allocations = allocation_count();
  const uint64_t transfers = runner.step_data().transfers();
  const uint64_t overflows = runner.workspace().overflow_allocations();
  const int kSteps = 12;  // crosses the 16-position page boundary of the 23- and 5-token prompts
  Tensor last;
  for (int n = 0; n < kSteps; ++n) last = step();
  EXPECT_EQ(allocation_count() - allocations, 0u)
      << fixture << ": allocations in warm decode steps";
  EXPECT_EQ(runner.step_data().transfers() - transfers, static_cast<uint64_t>(kSteps))
      << fixture << ": step-data transfers (one per step)";
  EXPECT_EQ(runner.workspace().overflow_allocations(), overflows);

  // The last step's logits equal a fresh forward of the same tokens over private caches.
  // `last` lives in the runner's workspace: copy it before running anything else.
  const Tensor got = last.clone();
  ForwardBatch ref;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t>& all = history[i];
    SequenceInput in;
    in.num_tokens = static_cast<int64_t>(all.size());
    in.logits = LogitsMode::kLast;
    in.cache = &refs[i];
    ref.seqs.push_back(in);
    ref.token_ids.insert(ref.token_ids.end(), all.begin(), all.end());
  }
  absl::StatusOr<Tensor> want = model.forward(ref);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got.shape(), want->shape());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst,
                     static_cast<double>(std::abs(got.data<float>()[i] - want->data<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want->data<float>()[i])));
  }
  // Decode after prefill vs one prefill of everything: the chunked and token-by-token forms of
  // the same f32 computation (the conformance bound of the engine tests).
  EXPECT_LT(worst, 2e-3 * std::max(scale, 1.0)) << fixture;
}

TEST(ModelRunnerStepMemory, KimiLinearDecodeAllocatesNothing) {
  check_decode_steps_allocate_nothing("kimi_linear_s1");
}
TEST(ModelRunnerStepMemory, Qwen3NextDecodeAllocatesNothing) {
  check_decode_steps_allocate_nothing("qwen3_next_s0");
}
TEST(ModelRunnerStepMemory, DeepSeekV3DecodeAllocatesNothing) {
  check_decode_steps_allocate_nothing("deepseek_v3_s1");
}
TEST(ModelRunnerStepMemory, FlaKdaDecodeAllocatesNothing) {
  check_decode_steps_allocate_nothing("fla_kda_s0");
}

}  // namespace
}  // namespace loom
