// Decode steps as CUDA graphs (engine/decode_graphs.h) against the same steps launched kernel by
// kernel, on every fixture family (KDA + MLA + MoE, GDN + gated GQA + MoE, MLA + grouped MoE, KDA
// with Block AttnRes).
//
// Two ModelRunners over two identical cache stores run one script of steps: prefills, mixed
// steps and decode steps at batch sizes that are and are not buckets (1, 3, 8, 13, 11, 1), with
// sequences joining and leaving between steps, one sequence long enough that its decode needs a
// wider page table (recorded lazily), and a step after the scratch slot and page were filled with
// NaN. Each step feeds both the same tokens (the eager run's greedy choice). Checks, printed as
// "GPUCHECK <name> <error> <bound> <PASS|FAIL>":
//   <fixture>_<numerics>_greedy_mismatch   rows whose argmax differs (graph vs eager): 0
//   <fixture>_deterministic_differing_logits  steps whose logits differ in any bit: 0
//   <fixture>_default_logits_rel_l2        default numerics (the padded batch changes GEMM shapes
//                                          and so the last bits): the fixtures' f32 bound 1e-4
//   <fixture>_<numerics>_nan_scratch_leak  non-finite logits after the poisoning, plus rows that
//                                          moved: 0
//   <fixture>_<numerics>_eager_steps_replayed  prefill or mixed steps that replayed a graph, plus
//                                          decode steps that did not: 0
// and at the engine level (--deterministic, requests of different lengths arriving together):
//   engine_graphs_greedy_mismatch          tokens differing between graphs on and off: 0
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cuda/launch.h"
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

constexpr int64_t kPageSize = 16;
constexpr int kSeqs = 16;
constexpr int kPagesPerSeq = 24;  // 384 positions: the long prompt and its decode fit

struct Case {
  const char* fixture;
  bool deterministic;
  WeightDType dtype;
};

std::string case_name(const Case& c) {
  return std::string(c.fixture) + (c.dtype == WeightDType::kBF16 ? "_bf16" : "_f32") +
         (c.deterministic ? "_deterministic" : "_default");
}

// One runner with its store; both arms of a case are built the same way.
struct Arm {
  std::unique_ptr<CacheStore> store;
  std::unique_ptr<ModelRunner> runner;
};

Arm make_arm(const Model& model, bool deterministic, bool graphs) {
  CacheStore::Options opt;
  opt.num_pages = 1 + kSeqs * kPagesPerSeq;
  opt.page_size = kPageSize;
  opt.num_slots = 1 + kSeqs;
  opt.device = model.device();
  opt.act_dtype = model.act_dtype();
  opt.kv_dtype = model.act_dtype();
  Arm a;
  a.store = std::make_unique<CacheStore>(model.config(), opt);
  a.runner = std::make_unique<ModelRunner>(model, *a.store, deterministic);
  const StepShape largest{/*tokens=*/512, /*seqs=*/kSeqs, /*logit_rows=*/kSeqs,
                          /*page_cols=*/kPagesPerSeq};
  a.runner->reserve(largest);
  if (graphs) {
    absl::StatusOr<GraphCaptureReport> r = a.runner->enable_decode_graphs(largest);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      std::printf("GPUINFO %s\n", r->describe().c_str());
      // Outside the deterministic mode (whose GEMMs are the batch-invariant kernels) every
      // fixture decodes through Loom's GEMVs, which take programmatic edges unless
      // LOOM_CUDA_PDL=0 (kernels/cuda/pdl.h).
      const char* pdl = std::getenv("LOOM_CUDA_PDL");
      if (!deterministic && (pdl == nullptr || std::string(pdl) != "0")) {
        EXPECT_GT(r->programmatic_edges, 0);
      }
    }
  }
  return a;
}

// NaN into the scratch slot of every linear layer and the scratch page of every attention layer.
void poison_scratch(const CacheStore& store, const ModelConfig& cfg) {
  auto fill_nan = [](const Tensor& t) {
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::kCpu);
    std::memset(host.raw(), 0xff, host.nbytes());  // all-ones bits: a NaN in f32 and in bf16
    t.copy_from(host);
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    const MixerType m = cfg.mixers[l];
    if (m == MixerType::kKda || m == MixerType::kGdn) {
      fill_nan(store.recurrent(l, CacheStore::kScratchSlot));
      fill_nan(store.conv(l, CacheStore::kScratchSlot));
    } else if (m == MixerType::kMla || m == MixerType::kGqa) {
      for (int w = 0; w < 2; ++w)
        if (store.pool(l, w).defined()) fill_nan(store.pool(l, w).select(CacheStore::kScratchPage));
    }
  }
}

class ModelGraphs : public ::testing::TestWithParam<Case> {};

TEST_P(ModelGraphs, GraphStepsMatchEagerSteps) {
  const Case& c = GetParam();
  const std::string dir = fixtures_dir() + "/" + c.fixture;
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no fixture " << dir;
  auto loaded = Model::load(dir, Placement{.device = Device::kCuda, .dtype = c.dtype});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const int64_t vocab = model.config().vocab_size;
  Arm eager = make_arm(model, c.deterministic, false);
  Arm graph = make_arm(model, c.deterministic, true);
  ASSERT_NE(graph.runner->decode_graphs(), nullptr);
  const DecodeGraphs& dg = *graph.runner->decode_graphs();

  std::mt19937_64 rng(gpu_test_seed() + 11);
  // Sequence i: slot i + 1, pages 1 + i * kPagesPerSeq ...; sequence 13's prompt is 300 tokens
  // (19 pages: its decode needs a table wider than the 16 columns recorded at start-up, which is
  // recorded when first needed).
  std::vector<std::vector<int32_t>> tables(kSeqs);
  std::vector<int32_t> pos(kSeqs, 0), next(kSeqs, 0);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    for (int p = 0; p < kPagesPerSeq; ++p) tables[i].push_back(1 + i * kPagesPerSeq + p);
    prompts[i] = random_ids(i == 13 ? 300 : 3 + (i * 7) % 37, vocab, rng);
  }

  size_t mismatched = 0, differing = 0, wrong_path = 0, leaks = 0;
  double worst_rel = 0;
  // One step: `prefill` sequences feed their prompts, `decode` ones their next token; both arms
  // run it; the eager arm's argmax is every sequence's next token. Returns the graph arm's logits
  // on the host.
  auto step = [&](const std::vector<int>& decode, const std::vector<int>& prefill) {
    BatchPlan plan;
    for (int i : decode) {
      SeqPlan s;
      s.request_id = i;
      s.state_slot = i + 1;
      s.page_table = tables[i];
      s.start_pos = pos[i];
      s.tokens = {next[i]};
      s.is_decode = true;
      s.sample = true;
      plan.seqs.push_back(s);
    }
    for (int i : prefill) {
      SeqPlan s;
      s.request_id = i;
      s.state_slot = i + 1;
      s.page_table = tables[i];
      s.tokens = prompts[i];
      s.sample = true;
      s.fresh_state = true;
      plan.seqs.push_back(s);
    }
    const int64_t replays = dg.replays();
    absl::StatusOr<Tensor> a = eager.runner->run(plan);
    EXPECT_TRUE(a.ok()) << a.status();
    const Tensor ha = a.ok() ? a->to(Device::kCpu) : Tensor();
    absl::StatusOr<Tensor> b = graph.runner->run(plan);
    EXPECT_TRUE(b.ok()) << b.status();
    const Tensor hb = b.ok() ? b->to(Device::kCpu) : Tensor();
    const bool should_replay = prefill.empty();
    wrong_path += (dg.replays() - replays == 1) != should_replay;
    if (!a.ok() || !b.ok()) return hb;
    EXPECT_EQ(ha.shape(), hb.shape());
    worst_rel = std::max(worst_rel, rel_l2(hb, ha));
    differing += static_cast<size_t>(
        std::memcmp(ha.raw(), hb.raw(), std::min(ha.nbytes(), hb.nbytes())) != 0);
    for (size_t r = 0; r < plan.seqs.size(); ++r) {
      const float* ra = ha.data<float>() + r * vocab;
      const float* rb = hb.data<float>() + r * vocab;
      const int32_t ta = static_cast<int32_t>(std::max_element(ra, ra + vocab) - ra);
      const int32_t tb = static_cast<int32_t>(std::max_element(rb, rb + vocab) - rb);
      mismatched += ta != tb;
      const int i = static_cast<int>(plan.seqs[r].request_id);
      pos[i] += static_cast<int32_t>(plan.seqs[r].tokens.size());
      next[i] = ta;
    }
    return hb;
  };
  auto decode_steps = [&](const std::vector<int>& seqs, int n) {
    for (int k = 0; k < n; ++k) step(seqs, {});
  };
  auto range = [](int lo, int hi) {
    std::vector<int> v;
    for (int i = lo; i < hi; ++i) v.push_back(i);
    return v;
  };

  step({}, {0});                 // a prefill: eager
  decode_steps({0}, 3);          // batch 1, a bucket
  step({0}, {1, 2});             // mixed: eager
  decode_steps({0, 1, 2}, 3);    // batch 3
  step({0, 1, 2}, range(3, 8));  // mixed
  decode_steps(range(0, 8), 3);  // batch 8
  step({}, range(8, 14));        // a prefill alone (sequence 13: 300 tokens)
  std::vector<int> thirteen = range(0, 14);
  thirteen.erase(thirteen.begin() + 1);  // sequence 1 left
  decode_steps(thirteen, 3);             // batch 13 (bucket 16), a 32-column table
  std::vector<int> eleven = thirteen;
  eleven.erase(std::remove_if(eleven.begin(), eleven.end(), [](int i) { return i == 0 || i == 5; }),
               eleven.end());
  decode_steps(eleven, 2);  // batch 11 (bucket 12): 0 and 5 left

  // NaN in the scratch slot and page of the graph arm (the eager arm never reads them).
  poison_scratch(*graph.store, model.config());
  const Tensor after = step(eleven, {});
  size_t nonfinite = 0;
  for (int64_t i = 0; i < after.numel(); ++i) nonfinite += !std::isfinite(after.data<float>()[i]);
  leaks = nonfinite;
  const size_t mismatched_before = mismatched;
  decode_steps({7}, 2);  // back to batch 1
  leaks += mismatched - mismatched_before;

  const std::string name = case_name(c);
  std::printf("GPUINFO %s: %lld replays, %lld recordings, worst rel_l2 %.3e\n", name.c_str(),
              static_cast<long long>(dg.replays()), static_cast<long long>(dg.captures()),
              worst_rel);
  check(name + "_greedy_mismatch", static_cast<double>(mismatched), 0);
  if (c.deterministic) {
    check(name + "_differing_logits", static_cast<double>(differing), 0);
  } else {
    check(name + "_logits_rel_l2", worst_rel, 1e-4);
  }
  check(name + "_nan_scratch_leak", static_cast<double>(leaks), 0);
  check(name + "_eager_steps_replayed", static_cast<double>(wrong_path), 0);
  if (graph.store->has_attention()) {
    EXPECT_GT(dg.captures(), static_cast<int64_t>(dg.buckets().size()))
        << "the wider page table was recorded lazily";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelGraphs,
                         ::testing::Values(Case{"kimi_linear_s1", false, WeightDType::kF32},
                                           Case{"kimi_linear_s1", true, WeightDType::kF32},
                                           Case{"kimi_linear_b0", true, WeightDType::kBF16},
                                           Case{"qwen3_next_s0", false, WeightDType::kF32},
                                           Case{"qwen3_next_s0", true, WeightDType::kF32},
                                           Case{"deepseek_v3_s1", false, WeightDType::kF32},
                                           Case{"deepseek_v3_s1", true, WeightDType::kF32},
                                           Case{"fla_kda_s0", false, WeightDType::kF32},
                                           Case{"fla_kda_s0", true, WeightDType::kF32}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return case_name(info.param);
                         });

// The engine with graphs on and off (--deterministic, so that however the loop thread happens to
// group the arriving requests the tokens may not move): 13 requests of different lengths arrive
// together and leave one by one, greedy tokens identical; the start-up recording is reported.
TEST(EngineGraphs, GreedyTokensMatchWithoutGraphs) {
  const std::string dir = fixtures_dir() + "/kimi_linear_s1";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no fixture " << dir;
  std::vector<Request> reqs;
  auto tokens_of = [&](bool graphs) {
    auto model = Model::load(dir, Placement{.device = Device::kCuda, .dtype = WeightDType::kF32});
    EXPECT_TRUE(model.ok()) << model.status();
    if (reqs.empty()) {
      std::mt19937_64 rng(gpu_test_seed() + 12);
      for (int i = 0; i < 13; ++i) {
        Request r;
        r.prompt = random_ids(4 + 5 * i, (*model)->config().vocab_size, rng);
        r.params.temperature = 0;
        r.params.max_tokens = 3 + i;
        r.params.ignore_eos = true;
        reqs.push_back(r);
      }
    }
    EngineOptions opt;
    opt.cache_budget_bytes = int64_t{64} << 20;
    opt.page_size = 16;
    opt.max_num_seqs = 16;
    opt.deterministic = true;
    opt.cuda_graphs = graphs;
    auto e = Engine::create(std::move(*model), nullptr, opt);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->graph_capture().has_value(), graphs);
    if ((*e)->graph_capture())
      std::printf("GPUINFO %s\n", (*e)->graph_capture()->describe().c_str());
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const Request& r : reqs) streams.push_back(*(*e)->submit(r));
    std::vector<std::vector<int32_t>> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i)
      while (auto ev = streams[i]->next()) {
        EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
        out[i].insert(out[i].end(), ev->token_ids.begin(), ev->token_ids.end());
      }
    return out;
  };
  const auto with = tokens_of(true);
  const auto without = tokens_of(false);
  size_t differ = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(with[i].size(), static_cast<size_t>(reqs[i].params.max_tokens));
    differ += with[i] != without[i];
  }
  check("engine_graphs_greedy_mismatch", static_cast<double>(differ), 0);
}

}  // namespace
}  // namespace loom
