// loom-conformance: checks Loom's forward pass against a fixture's golden outputs.
//
// For each prompt: full-prompt logits, logits with the prompt fed in two parts through the cache
// (cut at chunk_cut_i), and a 20-token greedy continuation with the cache. Prints one JSON line per
// prompt and a final summary line; exits 1 when a bound of fixtures/README.md is exceeded.
//
// OPENBLAS_CORETYPE (read by OpenBLAS itself; its DYNAMIC_ARCH builds pick the GEMM kernels by it)
// is checked here: the run fails when OpenBLAS does not report the requested kernels (a build that
// cannot switch), and exits 77 (ctest's skip) when this CPU cannot execute them (OpenBLAS would
// die of SIGILL). ctest runs every f32 fixture under several kernel families this way.
#include <cblas.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "engine/parallel/expert_load_balancer.h"
#include "engine/parallel/expert_parallel_dispatcher.h"
#include "engine/parallel/expert_parallel_nodes.h"
#include "engine/parallel/expert_weight_transfer.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"
#include "weights/safetensors.h"

ABSL_FLAG(std::string, fixture, "", "fixture directory (config.json, model.safetensors, golden.*)");
ABSL_FLAG(std::string, golden, "",
          "directory holding golden.json and golden.safetensors (default: the fixture itself; "
          "set it to check a converted checkpoint against the original's goldens)");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu, cuda or cuda:N (a CUDA build)");
ABSL_FLAG(std::string, dtype, "f32",
          "compute precision: f32 (f32 activations, the f32 bounds), or bf16 on a GPU: bf16 "
          "weight matrices (an FP8 checkpoint's kept in FP8 with --weight_dtype auto or fp8: "
          "W8A16) and bf16 activations (the residual stream, states, router and logits "
          "stay f32; weights/parameter_arena.h), held to the bounds "
          "fixtures/README.md derives from the reference's own bf16 error (golden.json "
          "reference_bf16: relative L2 <= max(2e-2, 1.25x its), top-1 >= min(98%, its - 3 "
          "points))");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "storage dtype of the weight matrices: auto (the checkpoint's: bf16 for a bf16 "
          "checkpoint, fp8 for an FP8 one on the CPU or with --dtype bf16, f32 otherwise), f32, "
          "bf16 or fp8 (on a GPU with --dtype bf16 only); on the CPU bf16 and fp8 weights are "
          "widened to f32 in the GEMMs, so a checkpoint stored so meets the f32 bounds");
ABSL_FLAG(bool, batch, false, "run all prompts together in one varlen batch");
ABSL_FLAG(bool, hidden, false, "also report per-layer hidden-state differences (full prefill)");
ABSL_FLAG(bool, deterministic, false,
          "batch-invariant numerics (the engine's --deterministic): same bounds, other kernels");
ABSL_FLAG(int, expert_parallel, 1,
          "ranks (threads, on the CPU) to spread the MoE experts over: each rank loads its own "
          "expert range (the first num_experts % N ranks one more), runs attention and the dense "
          "parts on its own prompts and exchanges tokens with the others per MoE layer. Unbatched, "
          "each prompt runs on rank i % N while the others join every step with a dummy forward "
          "(the experts see exactly one rank's tokens: bit-identical to one rank); with --batch "
          "the prompts are split over the ranks, all decoding at once (ranks without prompts "
          "idle). The same bounds as one rank. With --nnodes K, the ranks of the whole group, "
          "N / K in each of K processes");
ABSL_FLAG(std::string, expert_dispatch, "all_to_all",
          "with --expert_parallel: all_gather (hidden states and routing gathered, experts over "
          "every rank's tokens, outputs reduce-scattered: static shapes) or all_to_all (only the "
          "rows each rank needs move)");
ABSL_FLAG(int64_t, redundant_experts, 0,
          "with --expert_parallel: K extra physical expert slots per MoE layer, given to copies of "
          "the hottest experts (engine/parallel/expert_load_balancer.h); each rank then loads "
          "only its slots' experts and computes the slots routed to its copies, and a "
          "re-placement moves the weights of newly placed experts between ranks. 0 with "
          "--eplb_interval_steps 0: the contiguous ranges");
ABSL_FLAG(int, eplb_interval_steps, 0,
          "with --expert_parallel: recompute the expert placement from the load of the last "
          "--eplb_window_steps steps every this many steps (0: never)");
ABSL_FLAG(int, eplb_window_steps, 0,
          "with --eplb_interval_steps: the steps of expert load counted (0: the interval)");
ABSL_FLAG(double, expert_parallel_timeout_s, 120,
          "with --expert_parallel: a rank waiting longer at a collective fails the run");
ABSL_FLAG(int, nnodes, 1,
          "with --expert_parallel N: run the ranks in K processes (nodes), N / K each, joined over "
          "TCP (docs/expert-parallel.md); each prints the prompts its ranks ran");
ABSL_FLAG(int, node_rank, 0, "with --nnodes: this process's node, 0..K-1 (node 0 coordinates)");
ABSL_FLAG(std::string, inject_fault, "",
          "tests only (tests/conformance/expert_parallel_nodes_test.py): kill:S or stop:S makes "
          "this process SIGKILL or SIGSTOP itself at its S-th lockstep step (counted over its "
          "ranks), as a node that dies or hangs mid-run");
ABSL_FLAG(std::string, coordinator, "",
          "with --nnodes: HOST:PORT of node 0, which listens on PORT for the other nodes");
ABSL_FLAG(std::string, random_weights, "",
          "refused: the goldens were computed from the fixture's own weights (the server's and "
          "loom-bench-engine's flag)");

namespace loom {
namespace {

// Exit status ctest treats as "skipped" (SKIP_RETURN_CODE in tests/conformance/CMakeLists.txt).
constexpr int kSkipped = 77;

bool equal_ignoring_case(std::string a, std::string b) {
  auto lower = [](std::string& s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  };
  lower(a);
  lower(b);
  return a == b;
}

// What the OpenBLAS kernel family `core` executes beyond x86-64, when this CPU (and OS) lacks it;
// empty when it can run here or when the family is not one this check knows.
std::string missing_isa(const std::string& core) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (equal_ignoring_case(core, "Prescott") && !__builtin_cpu_supports("sse3")) return "SSE3";
  if ((equal_ignoring_case(core, "Haswell") || equal_ignoring_case(core, "Zen")) &&
      !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return "AVX2 and FMA";
  if (equal_ignoring_case(core, "SkylakeX") &&
      !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")))
    return "AVX-512 (F, CD, BW, DQ, VL)";
#endif
  return "";
}

// 0 when the GEMM kernels OPENBLAS_CORETYPE asks for are the ones OpenBLAS runs (or nothing is
// asked), kSkipped when this CPU cannot run them, 2 when OpenBLAS ignored the request.
int check_blas_coretype() {
  const char* want = std::getenv("OPENBLAS_CORETYPE");
  if (want == nullptr || *want == '\0') return 0;
  const std::string missing = missing_isa(want);
  if (!missing.empty()) {
    std::printf("loom-conformance: skipped: OPENBLAS_CORETYPE=%s needs %s, which this CPU lacks\n",
                want, missing.c_str());
    return kSkipped;
  }
  const std::string got = openblas_get_corename();
  if (!equal_ignoring_case(got, want)) {
    std::fprintf(stderr,
                 "loom-conformance: OPENBLAS_CORETYPE=%s but OpenBLAS runs its '%s' kernels (not a "
                 "DYNAMIC_ARCH build, or a core name it does not know)\n",
                 want, got.c_str());
    return 2;
  }
  return 0;
}

// Bounds of ../shared/fixtures/README.md for the CPU backend in f32.
constexpr double kMaxAbsBound = 1e-3;
constexpr double kRelL2Bound = 1e-4;

struct Diff {
  double max_abs = 0, sq_err = 0, sq_ref = 0;
  // FNV-1a over the bits of every logit added, in order: equal digests say two runs (other
  // rank counts, threads or processes) computed the same bits.
  uint64_t digest = 1469598103934665603ull;
  void add(const float* a, const float* ref, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &a[i], sizeof(bits));
      for (int b = 0; b < 4; ++b) digest = (digest ^ ((bits >> (8 * b)) & 0xff)) * 1099511628211ull;
      const double e = static_cast<double>(a[i]) - ref[i];
      max_abs = std::max(max_abs, std::abs(e));
      if (!std::isfinite(a[i])) max_abs = INFINITY;
      sq_err += e * e;
      sq_ref += static_cast<double>(ref[i]) * ref[i];
    }
  }
  double rel_l2() const { return sq_ref > 0 ? std::sqrt(sq_err / sq_ref) : std::sqrt(sq_err); }
};

int64_t argmax(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;
  return best;
}

struct Prompt {
  std::vector<int32_t> ids;
  int64_t cut = 0;
  Tensor logits, chunked, greedy_logits, hidden;
  std::vector<int64_t> greedy_tokens;
};

struct Result {
  Diff full, chunked, greedy;
  int greedy_match = 0;
  int64_t top1_match = 0, top1_rows = 0;  // full prefill rows whose argmax is the golden one
  std::vector<double> hidden_max_abs;
};

absl::StatusOr<std::vector<Prompt>> load_prompts(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", dir, "/golden.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json meta = nlohmann::json::parse(ss.str(), nullptr, false);
  if (meta.is_discarded() || !meta.contains("prompt_lengths"))
    return absl::InvalidArgumentError("golden.json: missing prompt_lengths");
  LOOM_ASSIGN_OR_RETURN(auto golden, SafetensorsFile::open(dir + "/golden.safetensors"));
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < meta["prompt_lengths"].size(); ++i) {
    Prompt p;
    LOOM_ASSIGN_OR_RETURN(Tensor ids, golden->get(absl::StrCat("input_ids_", i)));
    if (ids.dtype() != DType::kI64) return absl::InvalidArgumentError("input_ids must be i64");
    for (int64_t t = 0; t < ids.numel(); ++t)
      p.ids.push_back(static_cast<int32_t>(ids.data<int64_t>()[t]));
    p.cut = meta.value(absl::StrCat("chunk_cut_", i), static_cast<int64_t>(p.ids.size() / 2));
    if (p.cut <= 0 || p.cut >= static_cast<int64_t>(p.ids.size()))
      return absl::InvalidArgumentError(absl::StrCat("chunk_cut_", i, " out of range"));
    LOOM_ASSIGN_OR_RETURN(Tensor l, golden->get(absl::StrCat("logits_", i)));
    p.logits = l.to_f32();
    LOOM_ASSIGN_OR_RETURN(Tensor c, golden->get(absl::StrCat("chunked_logits_", i)));
    p.chunked = c.to_f32();
    LOOM_ASSIGN_OR_RETURN(Tensor gl, golden->get(absl::StrCat("greedy_logits_", i)));
    p.greedy_logits = gl.to_f32();
    LOOM_ASSIGN_OR_RETURN(Tensor gt, golden->get(absl::StrCat("greedy_tokens_", i)));
    if (gt.dtype() != DType::kI64) return absl::InvalidArgumentError("greedy_tokens must be i64");
    for (int64_t t = 0; t < gt.numel(); ++t) p.greedy_tokens.push_back(gt.data<int64_t>()[t]);
    if (golden->contains(absl::StrCat("hidden_states_", i))) {
      LOOM_ASSIGN_OR_RETURN(Tensor hs, golden->get(absl::StrCat("hidden_states_", i)));
      p.hidden = hs.to_f32();
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

// One rank of the run: its model and, with expert parallelism, its communicator and dispatcher.
struct Rank {
  const Model* model = nullptr;
  Communicator* comm = nullptr;  // null: one rank holding every expert, no lockstep
  ExpertParallelDispatcher* dispatcher = nullptr;  // the contiguous ranges' (one for all layers)
  ExpertLoadBalancer* balancer = nullptr;          // or the balancer of per-layer dispatchers

  void set_dummy_step(bool dummy) const {
    if (balancer != nullptr) balancer->set_dummy_step(dummy);
    if (dispatcher != nullptr) dispatcher->set_dummy_step(dummy);
  }
};

// --inject_fault: the signal and the lockstep step (over this process's ranks) to raise it at.
struct Fault {
  int signal = 0;  // 0: none
  int64_t step = 0;
};
Fault g_fault;
std::atomic<int64_t> g_lockstep_steps{0};

absl::StatusOr<Fault> parse_fault(const std::string& s) {
  if (s.empty()) return Fault{};
  const size_t colon = s.find(':');
  Fault f;
  const std::string kind = s.substr(0, colon);
  f.signal = kind == "kill" ? SIGKILL : kind == "stop" ? SIGSTOP : 0;
  if (colon == std::string::npos || f.signal == 0 ||
      !absl::SimpleAtoi(s.substr(colon + 1), &f.step) || f.step < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--inject_fault ", s, ": expected kill:S or stop:S with S >= 1"));
  return f;
}

// Counts a lockstep step of this process; raises the injected fault's signal at its step.
void lockstep_step() {
  const int64_t n = g_lockstep_steps.fetch_add(1) + 1;
  if (g_fault.signal != 0 && n == g_fault.step) raise(g_fault.signal);
}

// Runs one step for the given sequences: seq i feeds tokens[i] with `mode` logits. With expert
// parallelism the ranks first agree that the step runs (lockstep_tokens), and the rank's
// collectives must all have succeeded for its logits to mean anything.
absl::StatusOr<Tensor> step(const Rank& rank, std::vector<SequenceCache*> caches,
                            const std::vector<std::vector<int32_t>>& tokens, LogitsMode mode,
                            ActivationTape* tape = nullptr) {
  const Model& model = *rank.model;
  if (rank.comm != nullptr) {
    lockstep_step();
    int64_t n = 0;
    for (const auto& t : tokens) n += static_cast<int64_t>(t.size());
    LOOM_RETURN_IF_ERROR(lockstep_tokens(*rank.comm, n).status());
  }
  ForwardBatch b;
  b.batch_invariant = absl::GetFlag(FLAGS_deterministic);
  for (size_t i = 0; i < caches.size(); ++i) {
    b.token_ids.insert(b.token_ids.end(), tokens[i].begin(), tokens[i].end());
    b.seqs.push_back(
        {.num_tokens = static_cast<int64_t>(tokens[i].size()), .logits = mode, .cache = caches[i]});
  }
  // Compared on the host, whatever device the model runs on.
  LOOM_ASSIGN_OR_RETURN(Tensor logits, model.forward(b, tape));
  if (rank.comm != nullptr) LOOM_RETURN_IF_ERROR(rank.comm->status());
  return logits.to(Device::kCpu);
}

// A rank with nothing (more) to run joins the others' steps with dummy forwards (one filler token
// in a scratch cache, sent to no expert) until every rank is idle at once.
absl::Status idle_until_all_done(const Rank& rank) {
  while (true) {
    lockstep_step();
    LOOM_ASSIGN_OR_RETURN(const int64_t total, lockstep_tokens(*rank.comm, 0));
    if (total == 0) return absl::OkStatus();
    SequenceCache scratch = rank.model->new_cache();
    ForwardBatch b;
    b.batch_invariant = absl::GetFlag(FLAGS_deterministic);
    b.token_ids = {0};
    b.seqs.push_back({.num_tokens = 1, .logits = LogitsMode::kNone, .cache = &scratch});
    rank.set_dummy_step(true);
    const absl::StatusOr<Tensor> none = rank.model->forward(b);
    rank.set_dummy_step(false);
    LOOM_RETURN_IF_ERROR(none.status());
    LOOM_RETURN_IF_ERROR(rank.comm->status());
  }
}

// Evaluates the prompts in `group` together (one prompt when unbatched).
absl::Status run_group(const Rank& rank, std::vector<Prompt>& prompts,
                       const std::vector<size_t>& group, std::vector<Result>& results,
                       bool want_hidden) {
  const Model& model = *rank.model;
  const int64_t vocab = model.config().vocab_size;
  // 1. Full prefill, all logits; its caches then continue into greedy decoding.
  std::vector<SequenceCache> caches;
  for (size_t k = 0; k < group.size(); ++k) caches.push_back(model.new_cache());
  std::vector<SequenceCache*> ptrs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t k = 0; k < group.size(); ++k) {
    ptrs.push_back(&caches[k]);
    toks.push_back(prompts[group[k]].ids);
  }
  // The reference's hidden states: every layer's input, then the final normalised output.
  ActivationTape tape({"residual", "final_normed"});
  LOOM_ASSIGN_OR_RETURN(Tensor logits,
                        step(rank, ptrs, toks, LogitsMode::kAll, want_hidden ? &tape : nullptr));
  std::vector<Tensor> hidden;  // on the host
  for (int l = 0; l <= model.config().num_layers; ++l) {
    const Tensor* h = tape.find(l < model.config().num_layers ? l : -1,
                                l < model.config().num_layers ? "residual" : "final_normed");
    if (h == nullptr) break;
    hidden.push_back(h->to(Device::kCpu));
  }
  int64_t row = 0;
  std::vector<int64_t> last_row;
  for (size_t k = 0; k < group.size(); ++k) {
    Prompt& p = prompts[group[k]];
    const int64_t t = static_cast<int64_t>(p.ids.size());
    results[group[k]].full.add(logits.data<float>() + row * vocab, p.logits.data<float>(),
                               t * vocab);
    for (int64_t j = 0; j < t; ++j) {
      results[group[k]].top1_match += argmax(logits.data<float>() + (row + j) * vocab, vocab) ==
                                      argmax(p.logits.data<float>() + j * vocab, vocab);
      ++results[group[k]].top1_rows;
    }
    if (want_hidden && p.hidden.defined()) {
      const int64_t d = model.config().hidden_size;
      for (size_t j = 0; j < hidden.size() && j < static_cast<size_t>(p.hidden.dim(0)); ++j) {
        Diff hd;
        hd.add(hidden[j].data<float>() + row * d, p.hidden.select(j).data<float>(), t * d);
        results[group[k]].hidden_max_abs.push_back(hd.max_abs);
      }
    }
    row += t;
    last_row.push_back(row - 1);
  }

  // 2. Greedy continuation from the full-prefill caches.
  std::vector<std::vector<float>> step_logits(group.size());
  for (size_t k = 0; k < group.size(); ++k)
    step_logits[k].assign(logits.data<float>() + last_row[k] * vocab,
                          logits.data<float>() + (last_row[k] + 1) * vocab);
  std::vector<bool> diverged(group.size(), false);
  const size_t steps = prompts[group[0]].greedy_tokens.size();
  for (size_t s = 0; s < steps; ++s) {
    std::vector<std::vector<int32_t>> next(group.size());
    for (size_t k = 0; k < group.size(); ++k) {
      Prompt& p = prompts[group[k]];
      Result& r = results[group[k]];
      const int64_t tok = argmax(step_logits[k].data(), vocab);
      if (!diverged[k])
        r.greedy.add(step_logits[k].data(), p.greedy_logits.data<float>() + s * vocab, vocab);
      if (tok == p.greedy_tokens[s] && !diverged[k]) {
        ++r.greedy_match;
      } else {
        diverged[k] = true;
      }
      next[k] = {static_cast<int32_t>(tok)};
    }
    if (s + 1 == steps) break;
    LOOM_ASSIGN_OR_RETURN(Tensor l, step(rank, ptrs, next, LogitsMode::kLast));
    for (size_t k = 0; k < group.size(); ++k)
      step_logits[k].assign(l.data<float>() + k * vocab, l.data<float>() + (k + 1) * vocab);
  }

  // 3. Two-part prefill through fresh caches.
  std::vector<SequenceCache> chunk_caches;
  for (size_t k = 0; k < group.size(); ++k) chunk_caches.push_back(model.new_cache());
  std::vector<SequenceCache*> cptrs;
  std::vector<std::vector<int32_t>> first, second;
  for (size_t k = 0; k < group.size(); ++k) {
    const Prompt& p = prompts[group[k]];
    cptrs.push_back(&chunk_caches[k]);
    first.emplace_back(p.ids.begin(), p.ids.begin() + p.cut);
    second.emplace_back(p.ids.begin() + p.cut, p.ids.end());
  }
  LOOM_ASSIGN_OR_RETURN(Tensor l1, step(rank, cptrs, first, LogitsMode::kAll));
  LOOM_ASSIGN_OR_RETURN(Tensor l2, step(rank, cptrs, second, LogitsMode::kAll));
  int64_t r1 = 0, r2 = 0;
  for (size_t k = 0; k < group.size(); ++k) {
    Prompt& p = prompts[group[k]];
    const int64_t t1 = p.cut, t2 = static_cast<int64_t>(p.ids.size()) - p.cut;
    results[group[k]].chunked.add(l1.data<float>() + r1 * vocab, p.chunked.data<float>(),
                                  t1 * vocab);
    results[group[k]].chunked.add(l2.data<float>() + r2 * vocab,
                                  p.chunked.data<float>() + t1 * vocab, t2 * vocab);
    r1 += t1;
    r2 += t2;
  }
  return absl::OkStatus();
}

// Evaluates every prompt over `ranks` thread ranks (--expert_parallel), in phases of at most one
// group per rank: unbatched, phase i runs prompt i on rank i % ranks; batched, one phase runs the
// prompts split in contiguous shares (so the ranks' tokens in rank order are the one-rank batch).
// After its group, or without one, a rank joins the others' steps with dummy forwards until every
// rank is idle, so each phase ends on all ranks together. `models` receives the ranks' models
// (with --nnodes, only this node's; the others' stay null) and `local` the prompts they ran.
absl::Status run_expert_parallel(int ranks, ExpertExchange exchange, const std::string& dir,
                                 const Placement& placement, std::vector<Prompt>& prompts,
                                 bool batched, std::vector<Result>& results,
                                 std::vector<std::unique_ptr<Model>>& models,
                                 ExpertLoadBalancer::Balance& balance,
                                 std::vector<ExpertWeightTransfer::Moved>& moved,
                                 std::vector<bool>& local) {
  LOOM_ASSIGN_OR_RETURN(const ModelConfig cfg, load_model_config(dir));
  const int64_t experts = cfg.moe.num_experts;
  if (std::find(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe) == cfg.ffns.end() ||
      experts < ranks)
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert_parallel ", ranks, " needs an MoE model with at least one expert per rank (",
        cfg.model_type, " has ", experts, " experts)"));
  std::vector<std::vector<std::vector<size_t>>> phases;  // [phase][rank]: the rank's prompts
  if (batched) {
    phases.emplace_back(ranks);
    for (size_t i = 0; i < prompts.size(); ++i) phases[0][i * ranks / prompts.size()].push_back(i);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) {
      phases.emplace_back(ranks);
      phases.back()[i % ranks] = {i};
    }
  }
  const ExpertBalanceOptions balance_options{
      .redundant_experts = absl::GetFlag(FLAGS_redundant_experts),
      .interval_steps = absl::GetFlag(FLAGS_eplb_interval_steps),
      .window_steps = absl::GetFlag(FLAGS_eplb_window_steps)};
  LOOM_RETURN_IF_ERROR(check_expert_balance_options(balance_options, experts, ranks));
  const int moe_layers =
      static_cast<int>(std::count(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe));
  models.resize(ranks);
  moved.assign(ranks, {});
  const bool hidden = absl::GetFlag(FLAGS_hidden);
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_expert_parallel_timeout_s));
  // What every node must run alike for the ranks to be one group (the rendezvous compares them).
  std::ifstream config_file(dir + "/config.json", std::ios::binary);
  const std::string config_bytes((std::istreambuf_iterator<char>(config_file)),
                                 std::istreambuf_iterator<char>());
  std::string fixture = dir;
  while (!fixture.empty() && fixture.back() == '/') fixture.pop_back();
  fixture = fixture.substr(fixture.find_last_of('/') + 1);
  const ExpertParallelNodes nodes{.nnodes = absl::GetFlag(FLAGS_nnodes),
                                  .node_rank = absl::GetFlag(FLAGS_node_rank),
                                  .coordinator = absl::GetFlag(FLAGS_coordinator)};
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<RankGroup> group,
      create_rank_group(nodes, ranks, timeout,
                        {{"fixture", fixture},
                         {"config.json", content_fingerprint(config_bytes)},
                         {"expert_dispatch", std::string(expert_exchange_name(exchange))},
                         {"batch", batched ? "true" : "false"},
                         {"deterministic", absl::GetFlag(FLAGS_deterministic) ? "true" : "false"},
                         {"hidden", hidden ? "true" : "false"},
                         {"device", device_name(placement.device)},
                         {"weight_dtype", std::string(weight_dtype_name(placement.dtype))},
                         {"redundant_experts", absl::StrCat(balance_options.redundant_experts)},
                         {"eplb_interval_steps", absl::StrCat(balance_options.interval_steps)},
                         {"eplb_window_steps", absl::StrCat(balance_options.window_steps)}}));
  local.assign(prompts.size(), false);
  for (const auto& phase : phases)
    for (int r = group->first_rank(); r < group->first_rank() + group->local_size(); ++r)
      for (size_t i : phase[r]) local[i] = true;
  return run_local_ranks(*group, [&](Communicator& comm) -> absl::Status {
    const int r = comm.rank();
    Placement p = placement;
    Rank rank{.comm = &comm};
    std::shared_ptr<ExpertParallelDispatcher> dispatcher;
    std::unique_ptr<ExpertLoadBalancer> balancer;
    if (balance_options.enabled()) {
      // Each rank loads only its slots' experts and computes the slots routed to its copies; a
      // re-placement moves the newly placed experts' weights from the ranks holding them.
      balancer = std::make_unique<ExpertLoadBalancer>(comm, moe_layers, experts, balance_options);
      rank.balancer = balancer.get();
      p.expert_slots = balancer->load_slots();
      {
        const ScopedExpertDispatcher bind(balancer->dispatcher_factory(exchange));
        LOOM_ASSIGN_OR_RETURN(models[r], Model::load(dir, cfg, p));
      }
      LOOM_ASSIGN_OR_RETURN(std::vector<ExpertSlotWeights> slots,
                            find_expert_slot_weights(models[r]->parameters(), cfg));
      LOOM_RETURN_IF_ERROR(balancer->attach_weights(
          std::move(slots), std::make_unique<CommunicatorExpertWeightTransfer>(comm)));
    } else {
      dispatcher = std::make_shared<ExpertParallelDispatcher>(comm, experts, exchange);
      rank.dispatcher = dispatcher.get();
      p.experts = dispatcher->owned();
      const ScopedExpertDispatcher bind(dispatcher);
      LOOM_ASSIGN_OR_RETURN(models[r], Model::load(dir, cfg, p));
    }
    rank.model = models[r].get();
    for (const auto& phase : phases) {
      if (!phase[r].empty())
        LOOM_RETURN_IF_ERROR(run_group(rank, prompts, phase[r], results, hidden));
      LOOM_RETURN_IF_ERROR(idle_until_all_done(rank));
    }
    // Every rank's balancer holds the same numbers (the gathered window): the node's first
    // reports them.
    if (balancer != nullptr && r == group->first_rank()) balance = balancer->balance();
    if (balancer != nullptr) moved[r] = balancer->weights_moved();
    return absl::OkStatus();
  });
}

int run() {
  const std::string dir = absl::GetFlag(FLAGS_fixture);
  if (dir.empty()) {
    std::fprintf(stderr, "loom-conformance: --fixture DIR is required (see --help)\n");
    return 2;
  }
  absl::StatusOr<Device> device = parse_device(absl::GetFlag(FLAGS_device));
  if (device.ok()) {
    if (absl::Status st = device_available(*device); !st.ok()) device = st;
  }
  if (!device.ok()) {
    std::fprintf(stderr, "loom-conformance: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const bool bf16 = dtype == "bf16";
  if (dtype != "f32" && !bf16) {
    std::fprintf(stderr, "loom-conformance: --dtype %s: expected f32 or bf16\n", dtype.c_str());
    return 2;
  }
  if (bf16 && device->is_cpu()) {
    std::fprintf(stderr,
                 "loom-conformance: --dtype bf16 needs --device cuda: the CPU computes in f32 "
                 "(--weight_dtype bf16 stores the weights in bf16 there, within the f32 bounds)\n");
    return 2;
  }
  absl::StatusOr<WeightDType> weight_dtype = parse_weight_dtype(absl::GetFlag(FLAGS_weight_dtype));
  if (!weight_dtype.ok()) {
    std::fprintf(stderr, "loom-conformance: --weight_dtype: %s\n",
                 std::string(weight_dtype.status().message()).c_str());
    return 2;
  }
  if (bf16 && *weight_dtype == WeightDType::kF32) {
    std::fprintf(stderr,
                 "loom-conformance: --dtype bf16 computes with bf16 (or FP8) weight matrices; "
                 "--weight_dtype f32 contradicts it\n");
    return 2;
  }
  if (!bf16 && !device->is_cpu() && *weight_dtype == WeightDType::kFP8) {
    std::fprintf(stderr,
                 "loom-conformance: --weight_dtype fp8 on a GPU computes W8A16 (GEMM inputs "
                 "rounded to bf16 past a few rows), which the f32 bounds do not cover: use "
                 "--dtype bf16\n");
    return 2;
  }
  // --dtype bf16 with auto: the loader picks bf16 matrices, or FP8 for an FP8 checkpoint
  // (WeightLoader::placed, from the bf16 activations).
  if (const int rc = check_blas_coretype(); rc != 0) return rc;
  const bool batched = absl::GetFlag(FLAGS_batch);
  const int ranks = absl::GetFlag(FLAGS_expert_parallel);
  absl::StatusOr<ExpertExchange> exchange =
      parse_expert_exchange(absl::GetFlag(FLAGS_expert_dispatch));
  if (ranks < 1 || !exchange.ok() || (ranks > 1 && (!device->is_cpu() || bf16))) {
    std::fprintf(stderr,
                 "loom-conformance: --expert_parallel %d --expert_dispatch %s: expected N >= 1 "
                 "and all_gather or all_to_all; ranks are CPU threads (f32) until NCCL ranks "
                 "exist\n",
                 ranks, absl::GetFlag(FLAGS_expert_dispatch).c_str());
    return 2;
  }
  if (ranks == 1 && (absl::GetFlag(FLAGS_redundant_experts) != 0 ||
                     absl::GetFlag(FLAGS_eplb_interval_steps) != 0 ||
                     absl::GetFlag(FLAGS_eplb_window_steps) != 0)) {
    std::fprintf(stderr,
                 "loom-conformance: --redundant_experts, --eplb_interval_steps and "
                 "--eplb_window_steps balance experts over ranks: they need --expert_parallel N "
                 "with N >= 2\n");
    return 2;
  }
  const ExpertParallelNodes nodes{.nnodes = absl::GetFlag(FLAGS_nnodes),
                                  .node_rank = absl::GetFlag(FLAGS_node_rank),
                                  .coordinator = absl::GetFlag(FLAGS_coordinator)};
  if (ranks == 1 && (nodes.nnodes != 1 || nodes.node_rank != 0 || !nodes.coordinator.empty())) {
    std::fprintf(stderr,
                 "loom-conformance: --nnodes, --node_rank and --coordinator spread the ranks of "
                 "--expert_parallel N over processes: they need N >= 2\n");
    return 2;
  }
  if (absl::StatusOr<Fault> f = parse_fault(absl::GetFlag(FLAGS_inject_fault)); f.ok()) {
    g_fault = *f;
  } else {
    std::fprintf(stderr, "loom-conformance: %s\n", std::string(f.status().message()).c_str());
    return 2;
  }
  if (absl::Status st = check_expert_parallel_nodes(nodes, ranks); !st.ok()) {
    std::fprintf(stderr, "loom-conformance: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Placement placement{.device = *device,
                            .dtype = *weight_dtype,
                            .activations = bf16 ? ActivationDType::kBF16 : ActivationDType::kF32};
  const std::string golden_dir =
      absl::GetFlag(FLAGS_golden).empty() ? dir : absl::GetFlag(FLAGS_golden);
  absl::StatusOr<std::vector<Prompt>> prompts = load_prompts(golden_dir);
  if (!prompts.ok()) {
    std::fprintf(stderr, "loom-conformance: %s\n", std::string(prompts.status().message()).c_str());
    return 2;
  }
  std::vector<Result> results(prompts->size());
  std::vector<std::unique_ptr<Model>> models;      // one per rank
  ExpertLoadBalancer::Balance balance;             // --redundant_experts, --eplb_interval_steps
  std::vector<ExpertWeightTransfer::Moved> moved;  // per rank: expert weights re-placement moved
  std::vector<bool> local(prompts->size(), true);  // the prompts this process's ranks ran
  absl::Status st;
  if (ranks == 1) {
    absl::StatusOr<std::unique_ptr<Model>> model = Model::load(dir, placement);
    if (model.ok()) {
      models.push_back(*std::move(model));
      std::vector<std::vector<size_t>> groups;
      if (batched) {
        groups.emplace_back();
        for (size_t i = 0; i < prompts->size(); ++i) groups[0].push_back(i);
      } else {
        for (size_t i = 0; i < prompts->size(); ++i) groups.push_back({i});
      }
      for (const auto& g : groups) {
        st = run_group(Rank{.model = models[0].get()}, *prompts, g, results,
                       absl::GetFlag(FLAGS_hidden));
        if (!st.ok()) break;
      }
    } else {
      st = model.status();
    }
  } else {
    st = run_expert_parallel(ranks, *exchange, dir, placement, *prompts, batched, results, models,
                             balance, moved, local);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "loom-conformance: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  // This process's first rank's (with --nnodes, the others run elsewhere).
  const Model& model = **std::find_if(models.begin(), models.end(),
                                      [](const std::unique_ptr<Model>& m) { return m != nullptr; });
  // bf16: per prompt, the reference's own bf16 error (golden.json reference_bf16).
  std::vector<double> ref_rel, ref_top1;
  if (bf16) {
    std::ifstream in(golden_dir + "/golden.json");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json meta = nlohmann::json::parse(ss.str(), nullptr, false);
    if (meta.is_discarded() || !meta.contains("reference_bf16") ||
        !meta["reference_bf16"].contains("prompts") ||
        meta["reference_bf16"]["prompts"].size() != prompts->size()) {
      std::fprintf(stderr,
                   "loom-conformance: --dtype bf16: %s/golden.json records no reference_bf16 "
                   "error for each prompt (only the bf16 and FP8 fixtures do)\n",
                   golden_dir.c_str());
      return 2;
    }
    for (const nlohmann::json& e : meta["reference_bf16"]["prompts"]) {
      ref_rel.push_back(e.value("rel_l2", 0.0));
      ref_top1.push_back(e.value("top1", 1.0));
    }
  }
  bool ok = true;
  double worst_abs = 0, worst_rel = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!local[i]) continue;  // another node's ranks ran it, and that node reports it
    const Result& r = results[i];
    const Prompt& p = (*prompts)[i];
    const double top1 =
        r.top1_rows > 0 ? static_cast<double>(r.top1_match) / static_cast<double>(r.top1_rows) : 1;
    const double rel_bound = bf16 ? std::max(2e-2, 1.25 * ref_rel[i]) : kRelL2Bound;
    const double top1_bound = bf16 ? std::min(0.98, ref_top1[i] - 0.03) : 1.0;
    const bool pass =
        bf16 ? r.full.rel_l2() <= rel_bound && r.chunked.rel_l2() <= rel_bound && top1 >= top1_bound
             : r.full.max_abs <= kMaxAbsBound && r.full.rel_l2() <= kRelL2Bound &&
                   r.chunked.max_abs <= kMaxAbsBound &&
                   r.greedy_match == static_cast<int>(p.greedy_tokens.size()) &&
                   r.greedy.max_abs <= kMaxAbsBound;
    ok &= pass;
    worst_abs = std::max({worst_abs, r.full.max_abs, r.chunked.max_abs, r.greedy.max_abs});
    worst_rel = std::max(worst_rel, r.full.rel_l2());
    nlohmann::json line = {
        {"prompt", i},
        {"tokens", p.ids.size()},
        {"max_abs", r.full.max_abs},
        {"rel_l2", r.full.rel_l2()},
        {"chunked_max_abs", r.chunked.max_abs},
        {"greedy_match", r.greedy_match},
        {"greedy_steps", p.greedy_tokens.size()},
        {"greedy_logits_max_abs", r.greedy.max_abs},
        {"top1", top1},
        {"logits_digest",
         absl::StrFormat("%016x", r.full.digest ^ r.chunked.digest * 31 ^ r.greedy.digest * 961)},
        {"ok", pass}};
    if (bf16) {
      line["chunked_rel_l2"] = r.chunked.rel_l2();
      line["rel_l2_bound"] = rel_bound;
      line["top1_bound"] = top1_bound;
      line["reference_bf16_rel_l2"] = ref_rel[i];
    }
    if (!r.hidden_max_abs.empty()) line["hidden_max_abs"] = r.hidden_max_abs;
    std::cout << line.dump() << "\n";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string name = dir;
  while (!name.empty() && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);
  nlohmann::json summary = {
      {"fixture", name},
      {"model_type", model.config().model_type},
      {"batch", batched},
      {"weight_dtype", weight_dtype_name(model.placement().dtype)},
      {"parameter_bytes", model.parameters().bytes()},
      {"expert_weight_bytes", expert_weight_bytes(model.parameters())},
      {"prompts", std::count(local.begin(), local.end(), true)},
      {"worst_max_abs", worst_abs},
      {"worst_rel_l2", worst_rel},
      {"device", device_name(*device)},
      {"dtype", dtype},
      {"bounds", bf16 ? nlohmann::json("reference_bf16 (per prompt)")
                      : nlohmann::json({{"max_abs", kMaxAbsBound}, {"rel_l2", kRelL2Bound}})},
      {"seconds", secs},
      {"ok", ok}};
  summary["blas_core"] = openblas_get_corename();
  if (ranks > 1) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (size_t r = 0; r < models.size(); ++r) {
      if (models[r] == nullptr) continue;  // another node's
      const Model& m = *models[r];
      // What the rank holds: its expert range, or the experts of its slots as loaded (the same
      // for every layer until a re-placement), and the bytes of those experts' weights.
      nlohmann::json line = {{"rank", r},
                             {"parameter_bytes", m.parameters().bytes()},
                             {"expert_weight_bytes", expert_weight_bytes(m.parameters())}};
      if (!m.placement().expert_slots.empty()) {
        line["expert_slots"] = m.placement().expert_slots;
        line["experts_received"] = moved[r].experts;
        line["expert_bytes_received"] = moved[r].bytes;
      } else {
        const ExpertRange own = m.placement().owned_experts(m.config().moe.num_experts);
        line["experts"] = {own.begin, own.end};
      }
      per_rank.push_back(line);
    }
    summary["expert_parallel"] = ranks;
    summary["expert_dispatch"] = expert_exchange_name(*exchange);
    if (nodes.multi()) {
      summary["nnodes"] = nodes.nnodes;
      summary["node_rank"] = nodes.node_rank;
    }
    summary["ranks"] = per_rank;
    if (absl::GetFlag(FLAGS_redundant_experts) != 0 ||
        absl::GetFlag(FLAGS_eplb_interval_steps) != 0) {
      summary["redundant_experts"] = absl::GetFlag(FLAGS_redundant_experts);
      summary["eplb_interval_steps"] = absl::GetFlag(FLAGS_eplb_interval_steps);
      // Mean over MoE layers of mean / max rank load over the last gathered window: of the
      // placement in use, of the one computed from it, and of the contiguous ranges.
      summary["expert_load_balance"] = {{"replacements", balance.replacements},
                                        {"in_use", balance.before},
                                        {"recomputed", balance.after},
                                        {"contiguous", balance.contiguous}};
    }
  }
  std::cout << summary.dump() << std::endl;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Checks Loom's forward pass against a fixture's golden outputs.\n"
      "usage: loom-conformance --fixture DIR [--golden DIR] [--device cpu|cuda[:N]] [--dtype "
      "f32|bf16] "
      "[--weight_dtype auto|f32|bf16|fp8] [--batch] "
      "[--hidden] [--deterministic] [--expert_parallel N [--expert_dispatch "
      "all_gather|all_to_all] [--redundant_experts K] [--eplb_interval_steps P "
      "[--eplb_window_steps W]] [--nnodes K --node_rank R --coordinator HOST:PORT]]");
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_random_weights).empty()) {
    std::fprintf(stderr,
                 "loom-conformance: --random_weights is not accepted: the goldens were computed "
                 "from the fixture's own weights, so random ones cannot be checked against them "
                 "(use loom-server or loom-bench-engine for random weights)\n");
    return 2;
  }
  return loom::run();
}
