// Engine sessions (Request::session) on every family: a conversation continued turn by turn, each
// turn sending only its new tokens, gives bit-identical tokens and logprobs (deterministic mode)
// to one request carrying the whole token history, over several turns, with the session's cache
// kept, after preemption of a turn, after the kept cache was evicted (by the budgets or by memory
// pressure) and recomputed, after it was offloaded to host memory or disk and copied back (also
// under preemption, with the offload budget exhausted, and from a corrupt or missing file, which
// recomputes), and after a cancelled turn. Then the lifecycle: delete, ttl expiry (offloaded
// caches freed too), refusals (a turn while the previous one runs, too many sessions, too long,
// n > 1).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

using testing::append_logprob_bits;
using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

// What a client sees of a turn, logprobs as raw bits so that equality is bitwise.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;
  FinishReason finish = FinishReason::kNone;
  int32_t prompt_tokens = 0;
  bool operator==(const Trace&) const = default;
};

Trace trace(RequestStream& s) {
  Trace t;
  while (auto ev = s.next()) {
    t.tokens.insert(t.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    append_logprob_bits(ev->logprobs, &t.logprob_bits);
    if (ev->finish) {
      t.finish = *ev->finish;
      t.prompt_tokens = ev->prompt_tokens;
    }
  }
  return t;
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

// A conversation's turns: new tokens, seed and max_tokens of each. Lengths straddle page and
// checkpoint boundaries; the short ones take the recurrent path.
struct TurnSpec {
  std::vector<int32_t> tokens;
  uint64_t seed;
  int max_tokens;
};

std::vector<TurnSpec> conversation(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TurnSpec> turns;
  const int lengths[] = {83, 5, 61, 130};
  const int outputs[] = {13, 9, 20, 7};
  for (int i = 0; i < 4; ++i)
    turns.push_back({random_prompt(lengths[i], rng), seed + i, outputs[i]});
  return turns;
}

// The reference: each turn as one request carrying the whole history, on a fresh deterministic
// engine without prefix cache (nothing is reused). Returns the traces; `histories` gets the
// history before each turn.
std::vector<Trace> one_shot_traces(const std::string& fixture, const std::vector<TurnSpec>& turns) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.enable_prefix_cache = false;
  auto e = make_engine(fixture, opt);
  std::vector<Trace> out;
  std::vector<int32_t> history;
  for (const TurnSpec& t : turns) {
    history.insert(history.end(), t.tokens.begin(), t.tokens.end());
    out.push_back(trace(**e->submit(sampled(history, t.seed, t.max_tokens))));
    history.insert(history.end(), out.back().tokens.begin(), out.back().tokens.end());
  }
  return out;
}

std::string differs(const Trace& a, const Trace& b) {
  size_t i = 0;
  while (i < a.tokens.size() && i < b.tokens.size() && a.tokens[i] == b.tokens[i]) ++i;
  return "tokens equal up to " + std::to_string(i) + " of " + std::to_string(a.tokens.size()) +
         "/" + std::to_string(b.tokens.size()) +
         (a.logprob_bits == b.logprob_bits ? "" : ", logprobs differ");
}

Request turn_request(const std::string& session, const TurnSpec& t) {
  Request r = sampled(t.tokens, t.seed, t.max_tokens);
  r.session = session;
  return r;
}

int64_t bytes_per_slot_and_page(const std::string& fixture, int64_t slots, int64_t pages) {
  auto cfg = (*Model::load(kFixtures + "/" + fixture))->config();
  return static_cast<int64_t>(slots * CacheStore::slot_bytes(cfg) +
                              pages * CacheStore::page_bytes(cfg, 64));
}

class SessionEngine : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    turns_ = conversation(20261201);
    expect_ = one_shot_traces(GetParam(), turns_);
  }
  // Runs the conversation as session `name` on `e` and checks each turn against the reference.
  void run_conversation(Engine& e, const std::string& name, const char* what) {
    int64_t history = 0;
    for (size_t i = 0; i < turns_.size(); ++i) {
      const Trace t = trace(**e.submit(turn_request(name, turns_[i])));
      EXPECT_TRUE(t == expect_[i]) << what << ", turn " << i << ": " << differs(t, expect_[i]);
      history += static_cast<int64_t>(turns_[i].tokens.size());
      EXPECT_EQ(t.prompt_tokens, history) << "usage counts the whole history";
      history += static_cast<int64_t>(t.tokens.size());
    }
  }

  // Sessions `names` take their turns in rounds (a's turn i, b's turn i, ...), each turn checked
  // against the reference; `between_rounds` runs after each round, once the engine is idle.
  void run_interleaved(Engine& e, const std::vector<std::string>& names, const char* what,
                       const std::function<void(size_t)>& between_rounds = nullptr) {
    for (size_t i = 0; i < turns_.size(); ++i) {
      for (const std::string& name : names) {
        const Trace t = trace(**e.submit(turn_request(name, turns_[i])));
        EXPECT_TRUE(t == expect_[i])
            << what << ", session " << name << " turn " << i << ": " << differs(t, expect_[i]);
      }
      e.wait_idle();
      if (between_rounds) between_rounds(i);
    }
  }
  // The conversation among noise requests in a cache too small for all of them.
  void run_under_pressure(Engine& e);

  std::vector<TurnSpec> turns_;
  std::vector<Trace> expect_;
};

// A session's kept cache after its first turn (96 tokens: 2 pages and a slot).
int64_t first_turn(const std::string& fixture) { return bytes_per_slot_and_page(fixture, 1, 2); }

int files_in(const std::string& dir) {
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) n += f.is_regular_file();
  return n;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/session_offload_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// The kept cache is used: every turn after the first resumes from the previous turn's end (the
// resumed positions count as prefix hits), and the engine keeps one session's pages and slot.
TEST_P(SessionEngine, ContinuingEqualsWholeHistory) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.max_num_batched_tokens = 37;  // cuts the turns at other places than the reference
  auto e = make_engine(GetParam(), opt);
  run_conversation(*e, "chat", "kept cache");
  e->wait_idle();
  const EngineStats st = e->stats();
  EXPECT_EQ(st.sessions, 1);
  EXPECT_EQ(st.sessions_resident, 1);
  EXPECT_EQ(st.session_evictions, 0);
  EXPECT_GT(st.session_bytes, 0);
  int64_t resumed = 0, history = 0;
  for (size_t i = 0; i + 1 < turns_.size(); ++i) {
    history += static_cast<int64_t>(turns_[i].tokens.size() + expect_[i].tokens.size());
    resumed += history - 1;  // all but the last generated token, which the next turn feeds
  }
  EXPECT_GE(st.prefix_hit_tokens, resumed) << "turns must resume from the kept state";
  EXPECT_EQ(
      st.session_history_tokens,
      history + static_cast<int64_t>(turns_.back().tokens.size() + expect_.back().tokens.size()));
  ASSERT_TRUE(e->delete_session("chat").ok());
  e->wait_idle();
  for (int i = 0; i < 100 && e->stats().sessions_resident != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->stats().sessions, 0);
  EXPECT_EQ(e->stats().sessions_resident, 0);
  EXPECT_EQ(e->stats().session_pages, 0);
  EXPECT_EQ(e->delete_session("chat").code(), absl::StatusCode::kNotFound);
}

// With the prefix cache off, a session is the only thing reused.
TEST_P(SessionEngine, ContinuingWithoutPrefixCache) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.enable_prefix_cache = false;
  auto e = make_engine(GetParam(), opt);
  run_conversation(*e, "chat", "no prefix cache");
  e->wait_idle();
  EXPECT_GT(e->stats().prefix_hit_tokens, 0);
}

// Kept caches that exceed the per-session budget are not kept, and the total budget keeps one of
// two interleaved sessions: every turn is recomputed from the history at least once.
TEST_P(SessionEngine, EvictedByBudgetsRecomputes) {
  {
    EngineOptions opt;
    opt.deterministic = true;
    opt.session_offload_bytes = 0;
    opt.session_max_bytes = 1;  // nothing fits: history only
    auto e = make_engine(GetParam(), opt);
    run_conversation(*e, "a", "per-session budget");
    e->wait_idle();
    EXPECT_EQ(e->stats().sessions_resident, 0);
    EXPECT_EQ(e->stats().session_bytes, 0);
  }
  EngineOptions opt;
  opt.deterministic = true;
  opt.session_offload_bytes = 0;  // evicted, not offloaded
  // Room for one session's kept cache after its last turn (the largest), not two.
  opt.sessions_max_bytes = bytes_per_slot_and_page(GetParam(), 1, 8);
  auto e = make_engine(GetParam(), opt);
  std::vector<int64_t> history(2, 0);
  for (size_t i = 0; i < turns_.size(); ++i) {
    for (const char* name : {"a", "b"}) {
      const Trace t = trace(**e->submit(turn_request(name, turns_[i])));
      EXPECT_TRUE(t == expect_[i])
          << "total budget, session " << name << " turn " << i << ": " << differs(t, expect_[i]);
    }
    e->wait_idle();
    EXPECT_LE(e->stats().session_bytes, opt.sessions_max_bytes);
  }
  EXPECT_GT(e->stats().session_evictions, 0);
  EXPECT_EQ(e->stats().sessions, 2);
}

// Under memory pressure: the session's turns run among other requests in a cache too small for
// all of them, so turns are preempted (and recomputed from the history) and kept caches are
// evicted for running requests.
TEST_P(SessionEngine, SameUnderPreemptionAndPressureEviction) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.session_offload_bytes = 0;
  opt.max_num_seqs = 8;
  opt.max_num_batched_tokens = 64;
  opt.cache_budget_bytes = bytes_per_slot_and_page(GetParam(), 17, 13);
  auto e = make_engine(GetParam(), opt);
  run_under_pressure(*e);
  const EngineStats st = e->stats();
  EXPECT_GT(st.preemptions, 0) << "the budget must force preemption";
  EXPECT_GT(st.session_evictions, 0) << "running requests must evict the kept cache";
}

// The same with the offload tier: the kept cache moves to host memory when running requests need
// the pool, and comes back for the next turn.
TEST_P(SessionEngine, OffloadUnderPreemptionAndPressure) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.max_num_seqs = 8;
  opt.max_num_batched_tokens = 64;
  opt.cache_budget_bytes = bytes_per_slot_and_page(GetParam(), 17, 13);
  auto e = make_engine(GetParam(), opt);
  run_under_pressure(*e);
  const EngineStats st = e->stats();
  EXPECT_GT(st.preemptions, 0) << "the budget must force preemption";
  EXPECT_GT(st.session_offloads, 0) << "running requests must move the kept cache out";
  EXPECT_GT(st.session_restores, 0);
  EXPECT_EQ(st.session_evictions, 0);
}

void SessionEngine::run_under_pressure(Engine& engine) {
  Engine* e = &engine;
  std::mt19937 rng(77);
  std::vector<std::shared_ptr<RequestStream>> noise;
  for (size_t i = 0; i < turns_.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      Request r = sampled(random_prompt(std::uniform_int_distribution<int>(40, 200)(rng), rng),
                          1000 + i * 4 + k, std::uniform_int_distribution<int>(5, 24)(rng));
      r.params.logprobs = -1;
      noise.push_back(*e->submit(std::move(r)));
    }
    const Trace t = trace(**e->submit(turn_request("chat", turns_[i])));
    EXPECT_TRUE(t == expect_[i]) << "under pressure, turn " << i << ": " << differs(t, expect_[i]);
  }
  for (auto& s : noise) trace(*s);
  e->wait_idle();
}

// A cancelled turn leaves the history as it was: the next turn continues from before it.
TEST_P(SessionEngine, CancelledTurnLeavesHistory) {
  EngineOptions opt;
  opt.deterministic = true;
  auto e = make_engine(GetParam(), opt);
  EXPECT_TRUE(trace(**e->submit(turn_request("chat", turns_[0]))) == expect_[0]);
  Request long_turn = turn_request("chat", turns_[2]);
  long_turn.params.max_tokens = 500;
  auto s = *e->submit(std::move(long_turn));
  ASSERT_TRUE(s->next().has_value());  // it runs
  // While it runs, the session refuses another turn.
  auto refused = e->submit(turn_request("chat", turns_[1]));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("in progress"), std::string::npos);
  e->cancel(s->id());
  EXPECT_EQ(trace(*s).finish, FinishReason::kCancelled);
  EXPECT_TRUE(trace(**e->submit(turn_request("chat", turns_[1]))) == expect_[1]);
}

// Two sessions without device room for kept caches: each turn's end moves its cache to host
// memory, and the next turn copies it back. Nothing is recomputed (no prefix cache: every history
// token but the last fed one is a resumed hit), and the replies equal the whole history's.
TEST_P(SessionEngine, OffloadedAndRestoredEqualsWholeHistory) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.enable_prefix_cache = false;
  opt.max_num_batched_tokens = 37;
  opt.sessions_max_bytes = 1;
  auto e = make_engine(GetParam(), opt);
  run_interleaved(*e, {"a", "b"}, "offloaded", [&](size_t) {
    const EngineStats st = e->stats();
    EXPECT_EQ(st.sessions_resident, 0);
    EXPECT_EQ(st.sessions_offloaded, 2);
    EXPECT_GT(st.session_offload_bytes, 0);
  });
  const EngineStats st = e->stats();
  int64_t resumed = 0, history = 0;
  for (size_t i = 0; i + 1 < turns_.size(); ++i) {
    history += static_cast<int64_t>(turns_[i].tokens.size() + expect_[i].tokens.size());
    resumed += history - 1;
  }
  EXPECT_EQ(st.prefix_hit_tokens, 2 * resumed) << "every later turn continues without recompute";
  EXPECT_EQ(st.session_restores, 2 * static_cast<int64_t>(turns_.size() - 1));
  EXPECT_EQ(st.session_offloads, 2 * static_cast<int64_t>(turns_.size()));
  EXPECT_EQ(st.session_evictions, 0);
  // Deleting the sessions frees what they hold, resident and offloaded.
  ASSERT_TRUE(e->delete_session("a").ok());
  ASSERT_TRUE(e->delete_session("b").ok());
  for (int i = 0;
       i < 100 && (e->stats().sessions_resident != 0 || e->stats().sessions_offloaded != 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->stats().sessions_offloaded, 0);
  EXPECT_EQ(e->stats().session_offload_bytes, 0);
  EXPECT_EQ(e->stats().sessions_resident, 0);
}

// An exhausted offload budget evicts, and the next turn recomputes: nothing fits in one byte;
// with room for one of three sessions' first-turn caches, the older offloaded one is dropped, and
// the larger later ones do not fit.
TEST_P(SessionEngine, OffloadBudgetExhaustedRecomputes) {
  {
    EngineOptions opt;
    opt.deterministic = true;
    opt.sessions_max_bytes = 1;
    opt.session_offload_bytes = 1;
    auto e = make_engine(GetParam(), opt);
    run_interleaved(*e, {"a", "b"}, "offload budget of 1 byte");
    const EngineStats st = e->stats();
    EXPECT_EQ(st.session_offloads, 0);
    EXPECT_EQ(st.session_restores, 0);
    EXPECT_EQ(st.sessions_resident + st.sessions_offloaded, 0) << "nothing is kept";
  }
  EngineOptions opt;
  opt.deterministic = true;
  opt.sessions_max_bytes = 1;
  opt.session_offload_bytes = first_turn(GetParam());
  auto e = make_engine(GetParam(), opt);
  run_interleaved(*e, {"a", "b", "c"}, "offload budget of one session", [&](size_t) {
    EXPECT_LE(e->stats().session_offload_bytes, opt.session_offload_bytes);
  });
  const EngineStats st = e->stats();
  EXPECT_GT(st.session_offloads, 0);
  EXPECT_GT(st.session_offload_lost, 0);
  EXPECT_GE(st.session_evictions, st.session_offload_lost);
}

// The disk tier: host memory for one session's first-turn cache, the others' (and every larger
// one) go to files and come back from them; deleting the sessions removes the files.
TEST_P(SessionEngine, OffloadDiskTier) {
  const std::string dir = fresh_dir(std::string("disk_") + GetParam());
  EngineOptions opt;
  opt.deterministic = true;
  opt.sessions_max_bytes = 1;
  opt.session_offload_bytes = first_turn(GetParam());
  opt.session_offload_dir = dir;
  auto e = make_engine(GetParam(), opt);
  int64_t most_on_disk = 0;
  run_interleaved(*e, {"a", "b", "c"}, "disk tier", [&](size_t) {
    const EngineStats st = e->stats();
    most_on_disk = std::max<int64_t>(most_on_disk, st.sessions_on_disk);
    EXPECT_EQ(files_in(dir), st.sessions_on_disk);
    EXPECT_GT(st.session_offload_disk_bytes, 0);
  });
  const EngineStats st = e->stats();
  EXPECT_GT(most_on_disk, 0);
  EXPECT_EQ(st.session_restores, 3 * static_cast<int64_t>(turns_.size() - 1));
  EXPECT_EQ(st.session_evictions, 0);
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(e->delete_session(name).ok());
  for (int i = 0; i < 100 && e->stats().sessions_on_disk != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(e->stats().session_offload_disk_bytes, 0);
  EXPECT_EQ(files_in(dir), 0);
}

// A corrupt or missing file is lost, not used: the turn recomputes from the history, the same.
TEST_P(SessionEngine, CorruptOrMissingOffloadFileRecomputes) {
  const std::string dir = fresh_dir(std::string("corrupt_") + GetParam());
  EngineOptions opt;
  opt.deterministic = true;
  opt.sessions_max_bytes = 1;
  opt.session_offload_bytes = first_turn(GetParam());
  opt.session_offload_dir = dir;
  auto e = make_engine(GetParam(), opt);
  int damaged = 0;
  run_interleaved(*e, {"a", "b", "c"}, "damaged files", [&](size_t round) {
    if (round % 2 != 0) return;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      if (++damaged % 2 == 0) {
        std::filesystem::remove(f.path());
        continue;
      }
      std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(static_cast<std::streamoff>(std::filesystem::file_size(f.path()) / 2));
      const char junk[4] = {0x7f, 0x11, 0x22, 0x33};
      io.write(junk, sizeof(junk));
    }
  });
  EXPECT_GT(damaged, 0);
  const EngineStats st = e->stats();
  EXPECT_EQ(st.session_offload_lost, damaged);
  EXPECT_GT(st.session_restores, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, SessionEngine,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0"));

Request greedy_turn(const std::string& session, std::vector<int32_t> tokens, int max_tokens) {
  Request r;
  r.prompt = std::move(tokens);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.session = session;
  return r;
}

// An idle session is dropped after its ttl (the loop wakes for it): history and kept cache gone,
// and the name starts a new conversation.
TEST(SessionLifecycle, TtlExpiry) {
  EngineOptions opt;
  opt.session_ttl_s = 0.3;
  auto e = make_engine("kimi_linear_s1", opt);
  std::mt19937 rng(5);
  const std::vector<int32_t> p = random_prompt(70, rng);
  const Trace first = trace(**e->submit(greedy_turn("s", p, 6)));
  e->wait_idle();
  EXPECT_EQ(e->stats().sessions_resident, 1);
  for (int i = 0; i < 200 && e->stats().sessions != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const EngineStats st = e->stats();
  EXPECT_EQ(st.sessions, 0);
  EXPECT_EQ(st.sessions_expired, 1);
  for (int i = 0; i < 200 && e->stats().sessions_resident != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(e->stats().sessions_resident, 0);
  // A new session under the same name: its prompt is only the new tokens.
  const Trace again = trace(**e->submit(greedy_turn("s", p, 6)));
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.prompt_tokens, 70);
}

// usage.cached_tokens of a session turn counts the history it continued from a kept cache (on
// the device or copied back from the offload tier), and only what the prefix cache held when the
// kept cache was lost and the history recomputed.
TEST(SessionLifecycle, CachedTokensCountWhatWasKept) {
  std::mt19937 rng(12);
  const std::vector<int32_t> first = random_prompt(150, rng), second = random_prompt(20, rng);
  auto cached_of_second_turn = [&](EngineOptions opt) {
    auto e = make_engine("kimi_linear_s1", opt);
    trace(**e->submit(greedy_turn("s", first, 9)));
    int32_t cached = -1;
    auto stream = *e->submit(greedy_turn("s", second, 3));
    while (auto ev = stream->next())
      if (ev->finish) cached = ev->cached_tokens;
    return cached;
  };
  const int32_t history = 150 + 9;
  EngineOptions kept;
  EXPECT_EQ(cached_of_second_turn(kept), history);
  EngineOptions offloaded;
  offloaded.sessions_max_bytes = 1;
  EXPECT_EQ(cached_of_second_turn(offloaded), history);
  EngineOptions lost = offloaded;
  lost.session_offload_bytes = 0;
  lost.enable_prefix_cache = false;
  EXPECT_EQ(cached_of_second_turn(lost), 0);
  lost.enable_prefix_cache = true;  // the session's blocks, to the last full one (a checkpoint)
  EXPECT_EQ(cached_of_second_turn(lost), 128);
}

// Expiry frees offloaded caches too.
TEST(SessionLifecycle, TtlExpiryFreesOffloaded) {
  EngineOptions opt;
  opt.session_ttl_s = 0.3;
  opt.sessions_max_bytes = 1;  // every kept cache is offloaded
  auto e = make_engine("kimi_linear_s1", opt);
  std::mt19937 rng(9);
  trace(**e->submit(greedy_turn("s", random_prompt(300, rng), 6)));
  trace(**e->submit(greedy_turn("t", random_prompt(300, rng), 6)));
  for (int i = 0; i < 200 && (e->stats().sessions != 0 || e->stats().sessions_offloaded != 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const EngineStats st = e->stats();
  EXPECT_EQ(st.sessions_expired, 2);
  EXPECT_EQ(st.session_offloads, 2);
  EXPECT_EQ(st.sessions_offloaded, 0);
  EXPECT_EQ(st.session_offload_bytes, 0);
}

TEST(SessionLifecycle, Refusals) {
  EngineOptions opt;
  opt.max_sessions = 1;
  opt.max_model_len = 200;
  auto e = make_engine("kimi_linear_s1", opt);
  std::mt19937 rng(6);
  EXPECT_EQ(trace(**e->submit(greedy_turn("a", random_prompt(100, rng), 4))).prompt_tokens, 100);
  auto other = e->submit(greedy_turn("b", random_prompt(10, rng), 4));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted);
  // History (104) + 90 new + 8 > 200: refused, and the session stays usable and unchanged.
  auto too_long = e->submit(greedy_turn("a", random_prompt(90, rng), 8));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("session 'a'"), std::string::npos);
  Request two = greedy_turn("a", random_prompt(5, rng), 4);
  two.params.n = 2;
  EXPECT_EQ(e->submit(std::move(two)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trace(**e->submit(greedy_turn("a", random_prompt(5, rng), 4))).prompt_tokens, 104 + 5);
  // A refused first turn creates nothing.
  ASSERT_TRUE(e->delete_session("a").ok());
  EXPECT_FALSE(e->submit(greedy_turn("c", random_prompt(199, rng), 8)).ok());
  EXPECT_EQ(e->stats().sessions, 0);
  EXPECT_TRUE(e->submit(greedy_turn("d", random_prompt(10, rng), 2)).ok());
}

// Deleting a session while its turn runs: the turn completes, nothing of it is kept.
TEST(SessionLifecycle, DeleteDuringTurn) {
  EngineOptions opt;
  auto e = make_engine("qwen3_next_s0", opt);
  std::mt19937 rng(8);
  auto s = *e->submit(greedy_turn("x", random_prompt(50, rng), 40));
  ASSERT_TRUE(s->next().has_value());
  ASSERT_TRUE(e->delete_session("x").ok());
  EXPECT_EQ(trace(*s).finish, FinishReason::kLength);
  e->wait_idle();
  const EngineStats st = e->stats();
  EXPECT_EQ(st.sessions, 0);
  EXPECT_EQ(st.sessions_resident, 0);
  EXPECT_EQ(st.slots_free, st.slots_total - 0) << "the turn's slot is free again";
}

}  // namespace
}  // namespace loom
