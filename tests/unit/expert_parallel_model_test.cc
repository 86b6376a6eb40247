// Whole models over thread ranks (each loading its own expert range, running attention on its own
// prompts, exchanging tokens per MoE layer) against the same model on one rank, on every MoE
// fixture, both exchanges, N = 2 and 3:
//  - one rank's tokens per step (a prompt on rank i % N, the others on dummy steps): the experts
//    see exactly one rank's batch, so the logits must be bit-identical whatever the kernels;
//  - the prompts split over the ranks, stepping together (ranks without a prompt idle): the
//    attention and dense GEMMs then run on each rank's share of the batch, and OpenBLAS rounds a
//    row differently with the row count: the same noise as batching the prompts differently on
//    one rank (printed beside: one rank's batched against unbatched logits). Held to 5e-4
//    absolute, half the fixtures' bound against the reference (measured: at most 1.8e-4, on
//    qwen3_next_b0); with batch-invariant kernels they are bit-identical.
// With the expert load balancer (redundant copies, placements recomputed every step or two, each
// rank loading only its slots' experts and the re-placements moving weights between the ranks):
// the same bounds, and bit-identical under batch-invariant kernels, where splitting an expert's
// rows over its copies changes no row.
// Every rank, and the one-rank reference, runs one OpenMP thread: OpenBLAS's OpenMP build rounds
// a GEMM differently with its thread count (with 2 threads for the reference and 1 per rank the
// first mode differs by up to 5e-5). Prints the worst difference of each configuration.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "engine/parallel/expert_load_balancer.h"
#include "engine/parallel/expert_parallel_dispatcher.h"
#include "engine/parallel/expert_weight_transfer.h"
#include "engine/parallel/thread_communicator.h"
#include "tests/unit/sharded_checkpoint_test_support.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;
constexpr int kDecodeSteps = 4;

std::vector<std::vector<int32_t>> load_prompt_ids(const std::string& dir) {
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  EXPECT_TRUE(golden.ok()) << golden.status();
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; (*golden)->contains(absl::StrCat("input_ids_", i)); ++i) {
    auto ids = (*golden)->get(absl::StrCat("input_ids_", i));
    std::vector<int32_t> p;
    for (int64_t t = 0; t < ids->numel(); ++t)
      p.push_back(static_cast<int32_t>(ids->data<int64_t>()[t]));
    out.push_back(std::move(p));
  }
  return out;
}

struct Rank {
  const Model* model;
  Communicator* comm;                    // null: one rank
  ExpertParallelDispatcher* dispatcher;  // null: one rank, or balanced
  bool deterministic;
  ExpertLoadBalancer* balancer = nullptr;  // balanced: its layers' dispatchers

  void set_dummy_step(bool dummy) const {
    if (dispatcher != nullptr) dispatcher->set_dummy_step(dummy);
    if (balancer != nullptr) balancer->set_dummy_step(dummy);
  }
};

absl::StatusOr<Tensor> step(const Rank& rank, const std::vector<SequenceCache*>& caches,
                            const std::vector<std::vector<int32_t>>& tokens, LogitsMode mode) {
  int64_t n = 0;
  ForwardBatch b;
  b.batch_invariant = rank.deterministic;
  for (size_t i = 0; i < caches.size(); ++i) {
    b.token_ids.insert(b.token_ids.end(), tokens[i].begin(), tokens[i].end());
    b.seqs.push_back(
        {.num_tokens = static_cast<int64_t>(tokens[i].size()), .logits = mode, .cache = caches[i]});
    n += static_cast<int64_t>(tokens[i].size());
  }
  if (rank.comm != nullptr) LOOM_RETURN_IF_ERROR(lockstep_tokens(*rank.comm, n).status());
  LOOM_ASSIGN_OR_RETURN(Tensor logits, rank.model->forward(b));
  if (rank.comm != nullptr) LOOM_RETURN_IF_ERROR(rank.comm->status());
  return logits;
}

// Dummy forwards (one filler token, sent to no expert) until every rank is idle.
absl::Status idle(const Rank& rank) {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(const int64_t total, lockstep_tokens(*rank.comm, 0));
    if (total == 0) return absl::OkStatus();
    SequenceCache scratch = rank.model->new_cache();
    ForwardBatch b;
    b.batch_invariant = rank.deterministic;
    b.token_ids = {0};
    b.seqs.push_back({.num_tokens = 1, .logits = LogitsMode::kNone, .cache = &scratch});
    rank.set_dummy_step(true);
    const absl::StatusOr<Tensor> none = rank.model->forward(b);
    rank.set_dummy_step(false);
    LOOM_RETURN_IF_ERROR(none.status());
    LOOM_RETURN_IF_ERROR(rank.comm->status());
  }
}

// Prefill of `which` prompts together (every row's logits), then kDecodeSteps decode steps
// feeding each prompt's own first tokens again (fixed inputs, so that no argmax can make the runs
// diverge). Appends each prompt's logits to out[prompt].
absl::Status run_prompts(const Rank& rank, const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<size_t>& which, std::vector<std::vector<float>>& out) {
  std::vector<SequenceCache> caches;
  for (size_t k = 0; k < which.size(); ++k) caches.push_back(rank.model->new_cache());
  std::vector<SequenceCache*> ptrs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t k = 0; k < which.size(); ++k) {
    ptrs.push_back(&caches[k]);
    toks.push_back(prompts[which[k]]);
  }
  const int64_t vocab = rank.model->config().vocab_size;
  LOOM_ASSIGN_OR_RETURN(Tensor logits, step(rank, ptrs, toks, LogitsMode::kAll));
  int64_t row = 0;
  for (size_t k = 0; k < which.size(); ++k) {
    const float* p = logits.data<float>() + row * vocab;
    const int64_t n = static_cast<int64_t>(prompts[which[k]].size()) * vocab;
    out[which[k]].insert(out[which[k]].end(), p, p + n);
    row += static_cast<int64_t>(prompts[which[k]].size());
  }
  for (int s = 0; s < kDecodeSteps; ++s) {
    for (size_t k = 0; k < which.size(); ++k) toks[k] = {prompts[which[k]][s]};
    LOOM_ASSIGN_OR_RETURN(Tensor l, step(rank, ptrs, toks, LogitsMode::kLast));
    for (size_t k = 0; k < which.size(); ++k)
      out[which[k]].insert(out[which[k]].end(), l.data<float>() + k * vocab,
                           l.data<float>() + (k + 1) * vocab);
  }
  return absl::OkStatus();
}

// phases[p][r]: the prompts rank r runs in phase p (see the file comment).
std::vector<std::vector<std::vector<size_t>>> phases_of(size_t prompts, int ranks, bool split) {
  std::vector<std::vector<std::vector<size_t>>> phases;
  if (split) {
    phases.emplace_back(ranks);
    for (size_t i = 0; i < prompts; ++i) phases[0][i * ranks / prompts].push_back(i);
  } else {
    for (size_t i = 0; i < prompts; ++i) {
      phases.emplace_back(ranks);
      phases.back()[i % ranks] = {i};
    }
  }
  return phases;
}

// `balance`: with the expert load balancer (ranks > 1), each rank loading only its slots;
// `moved` (when given) then adds the expert weights the re-placements moved between ranks.
std::vector<std::vector<float>> run_ranks(const std::string& dir, int ranks,
                                          ExpertExchange exchange, bool split, bool deterministic,
                                          const ExpertBalanceOptions* balance = nullptr,
                                          int64_t* moved = nullptr) {
  absl::Mutex moved_mu;
  const auto prompts = load_prompt_ids(dir);
  std::vector<std::vector<float>> out(prompts.size());
  auto cfg = load_model_config(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  if (ranks == 1) {
    // The ranks' thread count (run_thread_ranks below), restored after.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    auto model = Model::load(dir, *cfg);
    EXPECT_TRUE(model.ok()) << model.status();
    const Rank rank{model->get(), nullptr, nullptr, deterministic};
    for (const auto& phase : phases_of(prompts.size(), 1, split)) {
      const absl::Status st = run_prompts(rank, prompts, phase[0], out);
      EXPECT_TRUE(st.ok()) << st;
    }
    omp_set_num_threads(threads);
    return out;
  }
  const auto phases = phases_of(prompts.size(), ranks, split);
  const absl::Status st = run_thread_ranks(
      ranks, absl::Seconds(60),
      [&](Communicator& comm) -> absl::Status {
        std::shared_ptr<ExpertParallelDispatcher> dispatcher;
        std::unique_ptr<ExpertLoadBalancer> balancer;
        std::unique_ptr<Model> model;
        if (balance != nullptr) {
          const int layers =
              static_cast<int>(std::count(cfg->ffns.begin(), cfg->ffns.end(), FfnType::kMoe));
          balancer =
              std::make_unique<ExpertLoadBalancer>(comm, layers, cfg->moe.num_experts, *balance);
          // Only the rank's slots are loaded; re-placements move weights between the ranks.
          const std::vector<int32_t> slots = balancer->load_slots();
          {
            const ScopedExpertDispatcher bind(balancer->dispatcher_factory(exchange));
            LOOM_ASSIGN_OR_RETURN(model, Model::load(dir, *cfg, Placement{.expert_slots = slots}));
          }
          LOOM_ASSIGN_OR_RETURN(std::vector<ExpertSlotWeights> weights,
                                find_expert_slot_weights(model->parameters(), *cfg));
          for (const ExpertSlotWeights& w : weights)
            if (w.gate.dim(0) != static_cast<int64_t>(slots.size()))
              return absl::InternalError(absl::StrCat("rank ", comm.rank(), " holds ",
                                                      w.gate.dim(0), " experts for ", slots.size(),
                                                      " slots"));
          LOOM_RETURN_IF_ERROR(balancer->attach_weights(
              std::move(weights), std::make_unique<CommunicatorExpertWeightTransfer>(comm)));
        } else {
          dispatcher =
              std::make_shared<ExpertParallelDispatcher>(comm, cfg->moe.num_experts, exchange);
          const ScopedExpertDispatcher bind(dispatcher);
          LOOM_ASSIGN_OR_RETURN(model,
                                Model::load(dir, *cfg, Placement{.experts = dispatcher->owned()}));
        }
        const Rank rank{model.get(), &comm, dispatcher.get(), deterministic, balancer.get()};
        for (const auto& phase : phases) {
          if (!phase[comm.rank()].empty())
            LOOM_RETURN_IF_ERROR(run_prompts(rank, prompts, phase[comm.rank()], out));
          LOOM_RETURN_IF_ERROR(idle(rank));
        }
        if (balancer != nullptr && moved != nullptr) {
          const absl::MutexLock lock(&moved_mu);
          *moved += balancer->weights_moved().experts;
        }
        return absl::OkStatus();
      },
      /*threads_per_rank=*/1);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

double max_abs_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, bool* identical) {
  double worst = 0;
  *identical = a.size() == b.size();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size());
    if (a[i].size() != b[i].size()) return INFINITY;
    *identical &= std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0;
    for (size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  }
  return worst;
}

class ExpertParallelModel : public testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelModel, MatchesOneRank) {
  const std::string dir = kFixtures + "/" + GetParam();
  bool same = false;
  const double batching =
      max_abs_diff(run_ranks(dir, 1, ExpertExchange::kAllToAll, true, false),
                   run_ranks(dir, 1, ExpertExchange::kAllToAll, false, false), &same);
  std::printf("%s one rank, batched vs unbatched: max |logits difference| = %.3g\n",
              GetParam().c_str(), batching);
  for (const bool split : {false, true}) {
    const auto one = run_ranks(dir, 1, ExpertExchange::kAllToAll, split, false);
    for (const ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll}) {
      for (const int n : {2, 3}) {
        bool identical = false;
        const double worst =
            max_abs_diff(run_ranks(dir, n, exchange, split, false), one, &identical);
        std::printf("%s N=%d %s %s: max |logits - one rank's| = %.3g%s\n", GetParam().c_str(), n,
                    std::string(expert_exchange_name(exchange)).c_str(),
                    split ? "prompts split over ranks" : "one rank's tokens per step", worst,
                    identical ? " (bit-identical)" : "");
        if (split) {
          EXPECT_LE(worst, 5e-4) << "N=" << n;
        } else {
          EXPECT_TRUE(identical) << "N=" << n << ": " << worst;
        }
      }
    }
  }
  // Batch-invariant kernels: the split run is bit-identical too.
  const auto one = run_ranks(dir, 1, ExpertExchange::kAllToAll, true, true);
  bool identical = false;
  const double worst =
      max_abs_diff(run_ranks(dir, 3, ExpertExchange::kAllGather, true, true), one, &identical);
  EXPECT_TRUE(identical) << worst;
}

TEST_P(ExpertParallelModel, BalancedMatchesOneRank) {
  const std::string dir = kFixtures + "/" + GetParam();
  struct Config {
    int ranks;
    ExpertExchange exchange;
    ExpertBalanceOptions balance;
  };
  const Config configs[] = {
      {2, ExpertExchange::kAllGather, {.redundant_experts = 2, .interval_steps = 1}},
      {3, ExpertExchange::kAllToAll, {.redundant_experts = 4, .interval_steps = 2}}};
  int64_t moved_all = 0;  // the outputs above held after re-placements that moved weights
  for (const bool deterministic : {false, true}) {
    for (const bool split : {false, true}) {
      const auto one = run_ranks(dir, 1, ExpertExchange::kAllToAll, split, deterministic);
      for (const Config& c : configs) {
        bool identical = false;
        int64_t moved = 0;
        const double worst = max_abs_diff(
            run_ranks(dir, c.ranks, c.exchange, split, deterministic, &c.balance, &moved), one,
            &identical);
        moved_all += moved;
        std::printf(
            "%s balanced N=%d K=%ld %s %s%s: max |logits - one rank's| = %.3g%s; %ld expert "
            "weights moved between ranks\n",
            GetParam().c_str(), c.ranks, static_cast<long>(c.balance.redundant_experts),
            std::string(expert_exchange_name(c.exchange)).c_str(),
            split ? "prompts split over ranks" : "one rank's tokens per step",
            deterministic ? ", batch-invariant" : "", worst, identical ? " (bit-identical)" : "",
            static_cast<long>(moved));
        // An expert's rows split over its copies go through GEMMs of other row counts: the
        // batching noise of the split runs above, in the expert GEMMs too.
        if (deterministic) {
          EXPECT_TRUE(identical) << "N=" << c.ranks << ": " << worst;
        } else {
          EXPECT_LE(worst, 5e-4) << "N=" << c.ranks;
        }
      }
    }
  }
  EXPECT_GT(moved_all, 0) << "no re-placement moved an expert: the test checks no weight move";
}

// The ranks loading their slots from a sharded copy of the checkpoint (experts over 3 shard files
// with an index) and re-placing every step: the same logits as one rank loading the fixture's
// single file, bit for bit under batch-invariant kernels.
TEST_P(ExpertParallelModel, BalancedFromShardsMatchesOneRank) {
  const std::string dir = kFixtures + "/" + GetParam();
  const std::string sharded = std::string(LOOM_TEST_TMPDIR) + "/ep_model_sharded_" + GetParam();
  write_sharded_checkpoint(dir, sharded, -1);
  // The prompts (run_ranks reads them beside the model).
  std::filesystem::copy_file(dir + "/golden.safetensors", sharded + "/golden.safetensors");
  const ExpertBalanceOptions balance{.redundant_experts = 2, .interval_steps = 1};
  const auto one = run_ranks(dir, 1, ExpertExchange::kAllToAll, true, true);
  int64_t moved = 0;
  bool identical = false;
  const double worst =
      max_abs_diff(run_ranks(sharded, 3, ExpertExchange::kAllToAll, true, true, &balance, &moved),
                   one, &identical);
  std::printf(
      "%s sharded, balanced N=3 K=2 all_to_all, batch-invariant: max |logits - one "
      "rank's| = %.3g%s; %ld expert weights moved between ranks\n",
      GetParam().c_str(), worst, identical ? " (bit-identical)" : "", static_cast<long>(moved));
  EXPECT_TRUE(identical) << worst;
  std::filesystem::remove_all(sharded);
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ExpertParallelModel,
                         testing::Values("kimi_linear_s0", "kimi_linear_s1", "deepseek_v3_s1",
                                         "qwen3_next_s0", "kimi_linear_b0", "qwen3_next_b0",
                                         "deepseek_v3_fp8"));

}  // namespace
}  // namespace loom
