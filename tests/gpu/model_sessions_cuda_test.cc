// Engine sessions on the GPU (issue 18): a conversation continued turn by turn, each turn sending
// only its new tokens, gives bit-identical tokens and logprobs (deterministic mode) to one request
// carrying the whole history, with the session's cache kept on the device, offloaded to
// page-locked host memory and copied back, and spilled to a disk tier and read back. The CPU's
// tests/unit/session_engine_test.cc proves the same on the host; here the copies between the
// device's pages and state slots and the host tier are the GPU's (CacheStore's async transfers
// through allocate_transfer_buffer), which no CPU test exercises. Every fixture family runs (KDA +
// MLA, MLA only, GDN + gated GQA, KDA with Block AttnRes) in f32, and a bf16 checkpoint in bf16.
// Each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for run.sh's table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "engine/model/model.h"
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

// What a client sees of a turn; logprobs as raw bits so that equality is bitwise.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;
  int32_t prompt_tokens = 0;
  bool operator==(const Trace&) const = default;
};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

Trace trace(RequestStream& s) {
  Trace t;
  while (auto ev = s.next()) {
    t.tokens.insert(t.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (const TokenLogprob& lp : ev->logprobs) {
      t.logprob_bits.push_back(bits_of(lp.logprob));
      for (const auto& [id, v] : lp.top) {
        t.logprob_bits.push_back(static_cast<uint32_t>(id));
        t.logprob_bits.push_back(bits_of(v));
      }
    }
    if (ev->finish) t.prompt_tokens = ev->prompt_tokens;
  }
  return t;
}

// A conversation's turns: new tokens, sampling seed and max_tokens. Lengths straddle page (64)
// and checkpoint boundaries; the short ones take the recurrent path.
struct TurnSpec {
  std::vector<int32_t> tokens;
  uint64_t seed;
  int max_tokens;
};

std::vector<TurnSpec> conversation(uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> id(3, std::min<int64_t>(vocab, 300) - 1);  // never EOS
  const int lengths[] = {83, 5, 61, 130};
  const int outputs[] = {13, 9, 20, 7};
  std::vector<TurnSpec> turns;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> t(lengths[i]);
    for (int32_t& v : t) v = static_cast<int32_t>(id(rng));
    turns.push_back({std::move(t), seed + i, outputs[i]});
  }
  return turns;
}

Request sampled(std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 3;
  return r;
}

class SessionsCuda : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = fixtures_dir() + "/" + GetParam();
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << "no fixture " << dir_;
    ASSERT_TRUE(device_available(Device::kCuda).ok());
    auto probe = load();
    turns_ = conversation(gpu_test_seed() + 18, probe->config().vocab_size);
    std::printf("GPUINFO %s: %s activations\n", GetParam(),
                probe->act_dtype() == DType::kBF16 ? "bf16" : "f32");
    // The reference: each turn one request carrying the whole history, on a fresh deterministic
    // engine without prefix cache (nothing reused).
    EngineOptions opt;
    opt.deterministic = true;
    opt.enable_prefix_cache = false;
    auto e = engine(opt);
    std::vector<int32_t> history;
    for (const TurnSpec& t : turns_) {
      history.insert(history.end(), t.tokens.begin(), t.tokens.end());
      expect_.push_back(trace(**e->submit(sampled(history, t.seed, t.max_tokens))));
      history.insert(history.end(), expect_.back().tokens.begin(), expect_.back().tokens.end());
    }
  }

  std::unique_ptr<Model> load() const {
    auto m = Model::load(dir_, Placement{.device = Device::kCuda, .dtype = WeightDType::kAuto});
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(m).value();
  }
  std::unique_ptr<Engine> engine(const EngineOptions& opt) const {
    auto e = Engine::create(load(), nullptr, opt);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(e).value();
  }

  // Sessions `names` take their turns in rounds (a's turn i, b's turn i, ...); returns how many
  // turns differ from the reference in any token or logprob bit.
  int run_interleaved(Engine& e, const std::vector<std::string>& names) {
    int differing = 0;
    for (size_t i = 0; i < turns_.size(); ++i) {
      for (const std::string& name : names) {
        Request r = sampled(turns_[i].tokens, turns_[i].seed, turns_[i].max_tokens);
        r.session = name;
        const Trace t = trace(**e.submit(std::move(r)));
        differing += t == expect_[i] ? 0 : 1;
      }
      e.wait_idle();
    }
    return differing;
  }

  std::string dir_;
  std::vector<TurnSpec> turns_;
  std::vector<Trace> expect_;
};

// The kept cache: every later turn resumes on the device.
TEST_P(SessionsCuda, KeptOnDeviceEqualsWholeHistory) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.max_num_batched_tokens = 37;  // cuts the turns at other places than the reference
  auto e = engine(opt);
  check(std::string(GetParam()) + "_session_kept_turns_differing", run_interleaved(*e, {"chat"}),
        0);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.sessions_resident, 1);
  EXPECT_EQ(st.session_evictions, 0);
  EXPECT_EQ(st.session_restores, 0);
}

// Offloaded to host memory after every turn (no session may stay on the device) and copied back
// for the next: nothing recomputed.
TEST_P(SessionsCuda, OffloadedToHostEqualsWholeHistory) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.enable_prefix_cache = false;  // a session is the only thing reused
  opt.max_num_batched_tokens = 37;
  opt.sessions_max_bytes = 1;
  auto e = engine(opt);
  check(std::string(GetParam()) + "_session_offloaded_turns_differing",
        run_interleaved(*e, {"a", "b"}), 0);
  const EngineStats st = e->stats();
  const auto later_turns = static_cast<int64_t>(turns_.size() - 1);
  EXPECT_EQ(st.session_restores, 2 * later_turns);
  EXPECT_EQ(st.session_offloads, 2 * static_cast<int64_t>(turns_.size()));
  EXPECT_EQ(st.session_evictions, 0);
  EXPECT_EQ(st.sessions_offloaded, 2);
  ASSERT_TRUE(e->delete_session("a").ok());
  ASSERT_TRUE(e->delete_session("b").ok());
  for (int i = 0; i < 100 && e->stats().sessions_offloaded != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->stats().session_offload_bytes, 0);
}

// The host tier holds one first-turn cache; the others spill to files and are read back.
TEST_P(SessionsCuda, DiskTierEqualsWholeHistory) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / (std::string("loom_sessions_cuda_") + GetParam()))
          .string();
  std::filesystem::remove_all(dir);
  auto cfg = load()->config();
  EngineOptions opt;
  opt.deterministic = true;
  opt.enable_prefix_cache = false;
  opt.sessions_max_bytes = 1;
  opt.session_offload_bytes =
      static_cast<int64_t>(CacheStore::slot_bytes(cfg) + 2 * CacheStore::page_bytes(cfg, 64));
  opt.session_offload_dir = dir;
  auto e = engine(opt);
  int64_t most_on_disk = 0;
  int differing = 0;
  for (size_t i = 0; i < turns_.size(); ++i) {
    for (const char* name : {"a", "b", "c"}) {
      Request r = sampled(turns_[i].tokens, turns_[i].seed, turns_[i].max_tokens);
      r.session = name;
      differing += trace(**e->submit(std::move(r))) == expect_[i] ? 0 : 1;
    }
    e->wait_idle();
    most_on_disk = std::max<int64_t>(most_on_disk, e->stats().sessions_on_disk);
  }
  check(std::string(GetParam()) + "_session_disk_turns_differing", differing, 0);
  const EngineStats st = e->stats();
  EXPECT_GT(most_on_disk, 0);
  EXPECT_EQ(st.session_restores, 3 * static_cast<int64_t>(turns_.size() - 1));
  EXPECT_EQ(st.session_evictions, 0);
  e.reset();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SessionsCuda,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0", "kimi_linear_b0"));

}  // namespace
}  // namespace loom
