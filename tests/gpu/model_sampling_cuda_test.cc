// The batched GPU sampler (kernels/cuda/sampling.h, through engine/sampling/batch_sampler.h)
// against SamplerState::sample on the same logits with the same seeds: fresh random logits (with
// planted ties) at V = 384, 1000 and 163840 in batches of 1, 5 and 64, greedy and at temperatures
// 0.7, 1.3 and 4 (picks deep in the row) under every combination of top-k (1, 40, 3000, 5000, V),
// top-p (0.9, 1) and min-p (0, 0.1),
// with and without penalties, logit bias and min_tokens masks, over several steps so that the
// penalties see the tokens the samplers chose. Tokens must be identical, logprobs within 1e-5,
// top-logprob ids identical; the device scratch is poisoned before every call. Then the serving
// engine: seeded temperature-sampled tokens on the GPU equal the CPU engine's on fixture models.
// Between the two, the default select path against the full sorts it replaced (SelectPath).
//
// Each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for run.sh's table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/sampling/batch_sampler.h"
#include "gtest/gtest.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/sampling.h"
#include "kernels/exec.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/model_test_support.h"

namespace loom {
namespace {

void check(const std::string& name, double err, double bound) {
  const bool pass = err <= bound;
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, bound, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, bound) << name;
}

// The parameter combinations the rows cycle through.
std::vector<SamplingParams> combos(int64_t vocab) {
  std::vector<SamplingParams> out;
  for (bool extras : {false, true}) {
    SamplingParams greedy;
    greedy.temperature = 0;
    out.push_back(greedy);
    for (float t : {0.7f, 1.3f, 4.0f})
      for (int64_t k : {int64_t{1}, int64_t{40}, int64_t{3000}, int64_t{5000}, vocab})
        for (float p : {0.9f, 1.0f})
          for (float m : {0.0f, 0.1f}) {
            SamplingParams s;
            s.temperature = t;
            s.top_k = static_cast<int>(k);
            s.top_p = p;
            s.min_p = m;
            out.push_back(s);
          }
    if (!extras) continue;
    // The second half: penalties, a logit bias (with a repeated id) and min_tokens masks.
    for (size_t i = out.size() / 2; i < out.size(); ++i) {
      SamplingParams& s = out[i];
      s.repetition_penalty = 1.3f;
      s.presence_penalty = 0.4f;
      s.frequency_penalty = 0.6f;
      s.logit_bias = {{3, 5.0f}, {static_cast<int32_t>(vocab - 1), -2.5f}, {3, 1.25f}, {8, 9.0f}};
      s.min_tokens = 2;  // steps 0 and 1 mask 8 and 9
      s.stop_token_ids = {9};
    }
  }
  return out;
}

// Normal logits (sd 2) with ties planted at the top and in the body.
std::vector<float> random_logits(int64_t rows, int64_t vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::uniform_int_distribution<int64_t> pos(0, vocab - 1);
  std::vector<float> l(static_cast<size_t>(rows * vocab));
  for (float& x : l) x = d(rng);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = l.data() + r * vocab;
    const float top = *std::max_element(row, row + vocab);
    for (int i = 0; i < 3; ++i) row[pos(rng)] = top;
    for (int i = 0; i < 8; ++i) row[pos(rng)] = row[pos(rng)];
  }
  return l;
}

struct Mismatches {
  int64_t rows = 0, tokens = 0, top_ids = 0, bad_values = 0;
  double logprob = 0;
};

// `steps` steps of `rows` rows at `vocab`; row i of step s uses combo (i + s * rows) % combos.
Mismatches compare(int64_t vocab, int64_t rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<SamplingParams> all = combos(vocab);
  const int64_t runs =
      std::max<int64_t>(steps, (static_cast<int64_t>(all.size()) + rows - 1) / rows);
  const std::vector<int32_t> eos = {8};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(rng() % vocab));
  BatchSampler gpu(Device::kCuda);
  gpu.TEST_poison_scratch(true);
  Mismatches mm;
  // A fresh pair of states every `steps` runs (so that min_tokens masks come back).
  std::vector<SamplerState> gpu_states, cpu_states;
  for (int64_t run = 0; run < runs; ++run) {
    if (run % steps == 0) {
      gpu_states.clear();
      cpu_states.clear();
      for (int64_t i = 0; i < rows; ++i) {
        const uint64_t s = seed * 1000 + static_cast<uint64_t>(run * rows + i);
        gpu_states.emplace_back(s, prompt);
        cpu_states.emplace_back(s, prompt);
      }
    }
    std::vector<float> host = random_logits(rows, vocab, rng);
    std::vector<SamplingParams> params(rows);
    std::vector<SampleSlot> slots(rows);
    for (int64_t i = 0; i < rows; ++i) {
      params[i] = all[(i + run * rows) % all.size()];
      params[i].logprobs = i % 3 == 0 ? 20 : (i % 3 == 1 ? -1 : 0);
      slots[i] = {.state = &gpu_states[i], .params = &params[i], .eos_ids = eos};
    }
    Tensor h = Tensor::wrap(host.data(), {rows, vocab}, DType::kF32);
    const Tensor dev = h.to(Device::kCuda);
    const std::vector<SampledToken> got = gpu.sample(dev, slots);
    for (int64_t i = 0; i < rows; ++i) {
      std::span<float> row(host.data() + i * vocab, vocab);
      const SampledToken want = cpu_states[i].sample(row, params[i], eos);
      ++mm.rows;
      if (got[i].token != want.token) {
        ++mm.tokens;
        if (mm.tokens <= 5)
          std::printf(
              "mismatch V=%lld rows=%lld run=%lld row %lld (T %g k %d p %g m %g): gpu %d "
              "cpu %d\n",
              static_cast<long long>(vocab), static_cast<long long>(rows),
              static_cast<long long>(run), static_cast<long long>(i), params[i].temperature,
              params[i].top_k, params[i].top_p, params[i].min_p, got[i].token, want.token);
      }
      if (params[i].logprobs < 0) continue;
      if (!std::isfinite(got[i].logprob)) ++mm.bad_values;
      mm.logprob =
          std::max(mm.logprob, static_cast<double>(std::abs(got[i].logprob - want.logprob)));
      if (got[i].top_logprobs.size() != want.top_logprobs.size()) {
        ++mm.top_ids;
        continue;
      }
      for (size_t t = 0; t < want.top_logprobs.size(); ++t) {
        mm.top_ids += got[i].top_logprobs[t].first != want.top_logprobs[t].first;
        mm.logprob =
            std::max(mm.logprob, static_cast<double>(std::abs(got[i].top_logprobs[t].second -
                                                              want.top_logprobs[t].second)));
      }
    }
  }
  return mm;
}

class SamplerCuda : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(SamplerCuda, MatchesSamplerState) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const auto [vocab, rows] = GetParam();
  const uint64_t seed = gpu_test_seed() + static_cast<uint64_t>(vocab * 131 + rows);
  const Mismatches mm = compare(vocab, rows, /*steps=*/3, seed);
  const std::string name = "sampling_V" + std::to_string(vocab) + "_k" + std::to_string(rows);
  EXPECT_GT(mm.rows, 0);
  check(name + "_token_mismatch", static_cast<double>(mm.tokens), 0);
  check(name + "_top_id_mismatch", static_cast<double>(mm.top_ids + mm.bad_values), 0);
  check(name + "_logprob_max_abs", mm.logprob, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, SamplerCuda,
    ::testing::Values(std::pair<int64_t, int64_t>{384, 1}, std::pair<int64_t, int64_t>{384, 5},
                      std::pair<int64_t, int64_t>{384, 64}, std::pair<int64_t, int64_t>{1000, 1},
                      std::pair<int64_t, int64_t>{1000, 5}, std::pair<int64_t, int64_t>{1000, 64},
                      std::pair<int64_t, int64_t>{163840, 1},
                      std::pair<int64_t, int64_t>{163840, 5},
                      std::pair<int64_t, int64_t>{163840, 64}),
    [](const ::testing::TestParamInfo<std::pair<int64_t, int64_t>>& info) {
      // absl::StrCat, not operator+ on std::string: GCC 12 warns (-Wrestrict) on the latter here.
      return absl::StrCat("V", info.param.first, "_k", info.param.second);
    });

// ---- the select path against the full sorts ---------------------------------------------------

// Logit profiles that steer rows onto each branch of the select path: normal (most rows finish
// on their candidates), eight levels (ties far larger than the candidate set: every sampled
// row of a long vocabulary takes the full sort), and near-flat (a top-p = 1 pick lands deep).
enum class Profile { kNormal, kLevels, kFlat };

std::vector<float> profile_logits(Profile profile, int64_t rows, int64_t vocab,
                                  std::mt19937_64& rng) {
  if (profile == Profile::kNormal) return random_logits(rows, vocab, rng);
  std::vector<float> l(static_cast<size_t>(rows * vocab));
  std::uniform_int_distribution<int> level(0, 7);
  std::normal_distribution<float> flat(0.0f, 0.05f);
  for (float& x : l)
    x = profile == Profile::kLevels ? 0.5f * static_cast<float>(level(rng)) : flat(rng);
  return l;
}

// Row i's parameters: one of every top-k (1, 2, 40, the candidate-set edges 3072, 4096 and 4097,
// V - 1, V), top-p (1, 0.95, 0.43: not a multiple of 1/k, where ties at k would put the cut
// at an exact boundary on which the CPU's and the GPU's roundings may disagree), min-p (0, 0.02)
// and temperature (0.5, 1, 3), mixed by i.
SamplingParams select_params(int64_t i, int64_t vocab) {
  static const int64_t kTopK[] = {0, 1, 2, 40, 3072, 4096, 4097, -1};
  static const float kTopP[] = {1.0f, 0.95f, 0.43f};
  static const float kMinP[] = {0.0f, 0.02f};
  static const float kTemp[] = {0.5f, 1.0f, 3.0f};
  SamplingParams s;
  const int64_t k = kTopK[i % 8];
  s.top_k = static_cast<int>(k < 0 ? vocab - 1 : std::min(k, vocab));
  s.top_p = kTopP[(i / 8) % 3];
  s.min_p = kMinP[(i / 24) % 2];
  s.temperature = kTemp[(i / 48 + i) % 3];
  s.logprobs = i % 5 == 0 ? 5 : -1;
  return s;
}

// rows rows of one profile through sample_logits on the select path and both full sorts, and
// through SamplerState::sample with the same draws.
void compare_paths(Profile profile, int64_t vocab, int64_t rows, uint64_t seed,
                   const std::string& name) {
  std::mt19937_64 rng(seed);
  const std::vector<float> host = profile_logits(profile, rows, vocab, rng);
  const Exec ex = cuda::device_exec(0);
  Tensor h = Tensor::wrap(const_cast<float*>(host.data()), {rows, vocab}, DType::kF32);
  cuda::SampleBatch batch;
  std::vector<SamplingParams> params(rows);
  const uint64_t offset = rng() % 1000;
  for (int64_t i = 0; i < rows; ++i) {
    params[i] = select_params(i + static_cast<int64_t>(offset), vocab);
    cuda::launch::SampleRow r;
    r.row = static_cast<int32_t>(i);
    r.temperature = params[i].temperature;
    r.top_k = params[i].top_k;
    r.top_p = params[i].top_p;
    r.min_p = params[i].min_p;
    r.logprobs = params[i].logprobs;
    r.u = SamplerState(seed + static_cast<uint64_t>(i), {}).next_uniform();
    batch.rows.push_back(r);
  }
  const char* paths[] = {"select", "segmented", "per_row"};
  size_t bytes = 0;
  for (const char* p : paths) bytes = std::max(bytes, cuda::sample_scratch_bytes(batch, vocab, p));
  const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::kCuda);
  const std::vector<unsigned char> poison(bytes, 0xff);
  std::vector<cuda::launch::SampleOut> got[3];
  for (int p = 0; p < 3; ++p) {
    const Tensor logits = h.to(Device::kCuda);
    upload_async(ex, scratch.raw(), poison.data(), bytes);
    cuda::sample_logits(ex, logits, batch, scratch, got[p], paths[p]);
  }
  int64_t vs_full = 0, full_vs_full = 0, vs_cpu = 0, logprob_bits = 0, fallback = 0, sampled = 0;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<float> row(host.begin() + i * vocab, host.begin() + (i + 1) * vocab);
    SamplerState cpu(seed + static_cast<uint64_t>(i), {});
    const SampledToken want = cpu.sample(row, params[i], {});
    const cuda::launch::SampleOut &sel = got[0][i], &seg = got[1][i], &per = got[2][i];
    vs_full += sel.token != seg.token;
    full_vs_full += seg.token != per.token;
    vs_cpu += sel.token != want.token;
    if (sel.token != want.token && vs_cpu <= 5)
      std::printf(
          "mismatch %s row %lld (T %g k %d p %g m %g u %.17g): select %d segmented %d cpu %d\n",
          name.c_str(), static_cast<long long>(i), params[i].temperature, params[i].top_k,
          params[i].top_p, params[i].min_p, batch.rows[i].u, sel.token, seg.token, want.token);
    if (params[i].logprobs >= 0)
      logprob_bits +=
          sel.logprob != seg.logprob || sel.num_top != seg.num_top ||
          !std::equal(sel.top_ids, sel.top_ids + sel.num_top, seg.top_ids) ||
          !std::equal(sel.top_logprobs, sel.top_logprobs + sel.num_top, seg.top_logprobs);
    ++sampled;
    fallback += sel.sorted_all == 1;
  }
  check(name + "_select_vs_segmented_token_mismatch", static_cast<double>(vs_full), 0);
  check(name + "_segmented_vs_per_row_token_mismatch", static_cast<double>(full_vs_full), 0);
  check(name + "_select_vs_cpu_token_mismatch", static_cast<double>(vs_cpu), 0);
  check(name + "_select_vs_segmented_logprob_bits_differ", static_cast<double>(logprob_bits), 0);
  std::printf("%s: %lld of %lld sampled rows took the full sort\n", name.c_str(),
              static_cast<long long>(fallback), static_cast<long long>(sampled));
  // Which rows take the full sort follows from the profile: at a long vocabulary every level
  // holds more ties than the candidate set (kSelMax, 4096), which forces it everywhere; else
  // top-k 1 rows finish on the select path and top-k V - 1 rows (past the candidate set, below V)
  // take the full sort.
  if (profile == Profile::kLevels && vocab > 8 * 4096) {
    check(name + "_rows_not_on_full_sort", static_cast<double>(sampled - fallback), 0);
  } else if (vocab > 5000 && rows >= 48) {
    check(name + "_select_finished_none", fallback == sampled ? 1.0 : 0.0, 0);
    check(name + "_full_sort_none", fallback == 0 ? 1.0 : 0.0, 0);
  }
}

class SelectPath : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(SelectPath, MatchesFullSortsAndSamplerState) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const auto [vocab, rows] = GetParam();
  const uint64_t seed = gpu_test_seed() + static_cast<uint64_t>(vocab * 7 + rows);
  const std::string base = "select_V" + std::to_string(vocab) + "_k" + std::to_string(rows);
  compare_paths(Profile::kNormal, vocab, rows, seed, base + "_normal");
  compare_paths(Profile::kLevels, vocab, rows, seed + 1, base + "_levels");
  compare_paths(Profile::kFlat, vocab, rows, seed + 2, base + "_flat");
}

// V from below the candidate set (every row complete) to the real vocabularies; 70 rows span two
// groups of kSampleSortGroup. The rows that take the full sort get CUB's per-row sorts when
// there are few of them (1 and 9 rows, the second group of 70) and the segmented one otherwise.
INSTANTIATE_TEST_SUITE_P(Sizes, SelectPath,
                         ::testing::Values(std::pair<int64_t, int64_t>{300, 48},
                                           std::pair<int64_t, int64_t>{4097, 48},
                                           std::pair<int64_t, int64_t>{5000, 70},
                                           std::pair<int64_t, int64_t>{151936, 48},
                                           std::pair<int64_t, int64_t>{163840, 1},
                                           std::pair<int64_t, int64_t>{163840, 9},
                                           std::pair<int64_t, int64_t>{163840, 64}),
                         [](const ::testing::TestParamInfo<std::pair<int64_t, int64_t>>& info) {
                           return absl::StrCat("V", info.param.first, "_k", info.param.second);
                         });

// ---- the serving engine ------------------------------------------------------------------------

class EngineSamplingCuda : public ::testing::TestWithParam<const char*> {};

// Seeded temperature sampling through the whole engine (three concurrent requests, one with two
// choices, chunked prefill, filters, penalties, a bias, logprobs): the GPU engine's tokens equal
// the CPU engine's (f32 weights: the two forwards agree to ~1e-5, far from moving a draw across a
// boundary), and their logprobs agree to the forwards' own difference.
TEST_P(EngineSamplingCuda, SeededTokensMatchCpu) {
  const std::string dir = fixtures_dir() + "/" + GetParam();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no fixture " << dir;
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  auto cpu = Model::load(dir, Placement{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Model::load(dir, Placement{.device = Device::kCuda});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937_64 rng(gpu_test_seed() + 5);
  const int64_t vocab = (*cpu)->config().vocab_size;
  std::vector<Request> reqs;
  for (int64_t n : {5, 40, 77}) {
    Request r;
    r.prompt = random_ids(n, vocab, rng);
    r.params.temperature = n == 5 ? 0.7f : 1.1f;
    r.params.top_k = n == 40 ? 50 : 0;
    r.params.top_p = n == 77 ? 0.9f : 1.0f;
    r.params.min_p = n == 40 ? 0.05f : 0.0f;
    r.params.seed = 1000 + static_cast<uint64_t>(n);
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.logprobs = 3;
    if (n == 40) {
      r.params.presence_penalty = 0.5f;
      r.params.repetition_penalty = 1.2f;
      r.params.logit_bias = {{7, 2.0f}};
      r.params.n = 2;
    }
    reqs.push_back(r);
  }
  EngineOptions opt;
  opt.cache_budget_bytes = int64_t{64} << 20;
  opt.page_size = 16;
  opt.max_num_batched_tokens = 64;  // the 77-token prompt is prefilled in two chunks
  struct Out {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> logprobs;
  };
  auto run = [&](std::unique_ptr<Model> m) {
    auto e = Engine::create(std::move(m), nullptr, opt);
    EXPECT_TRUE(e.ok()) << e.status();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const Request& r : reqs) streams.push_back(*(*e)->submit(r));
    Out out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::vector<std::vector<int32_t>> tok(reqs[i].params.n);
      std::vector<std::vector<float>> lp(reqs[i].params.n);
      while (auto ev = streams[i]->next()) {
        EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
        tok[ev->index].insert(tok[ev->index].end(), ev->token_ids.begin(), ev->token_ids.end());
        for (const TokenLogprob& l : ev->logprobs) lp[ev->index].push_back(l.logprob);
      }
      for (int c = 0; c < reqs[i].params.n; ++c) {
        out.tokens.push_back(tok[c]);
        out.logprobs.push_back(lp[c]);
      }
    }
    return out;
  };
  const Out g = run(std::move(*gpu));
  const Out c = run(std::move(*cpu));
  ASSERT_EQ(g.tokens.size(), c.tokens.size());
  size_t differ = 0;
  double lp_err = 0;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    EXPECT_EQ(g.tokens[i], c.tokens[i]) << "choice " << i;
    EXPECT_EQ(c.tokens[i].size(), 12u);
    differ += g.tokens[i] != c.tokens[i];
    if (g.tokens[i] != c.tokens[i] || g.logprobs[i].size() != c.logprobs[i].size()) continue;
    for (size_t t = 0; t < c.logprobs[i].size(); ++t)
      lp_err = std::max(lp_err, static_cast<double>(std::abs(g.logprobs[i][t] - c.logprobs[i][t])));
  }
  check(std::string(GetParam()) + "_engine_sampled_choice_mismatch", static_cast<double>(differ),
        0);
  check(std::string(GetParam()) + "_engine_sampled_logprob_max_abs", lp_err, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineSamplingCuda,
                         ::testing::Values("kimi_linear_s0", "deepseek_v3_s1", "fla_kda_s0"));

}  // namespace
}  // namespace loom
