// Test support for the scheduler (header-only, not part of loom_scheduler's API): a deterministic
// fake model that really reads and writes simulated KV pages and state slots as the plan says, an
// oracle that computes the same tokens without any cache, and an ownership audit.
//
// The fake model: at position p with token t, a = digest of the KV of positions [0, p) (read from
// the pages), s = mix(s, t, a) (the linear state), kv_p = mix(t, p, a, s). The sampled token is
// mix(s, digest of [0, P]) % vocab. A wrong page table, a missed state reset or restore, a
// checkpoint at the wrong position or a write into a shared page changes the tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "scheduler/scheduler.h"

namespace loom::scheduler_testing {

// The seed of a randomized test: LOOM_TEST_SEED (decimal) when set, to replay a failure, else a
// fresh random one. Printed on stdout (so even a crash shows it); put seed_note(seed) in a
// SCOPED_TRACE so every failed assertion names it too.
inline uint32_t test_seed() {
  const char* env = std::getenv("LOOM_TEST_SEED");
  const uint32_t seed = env != nullptr && *env != '\0'
                            ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                            : std::random_device{}();
  std::printf("test seed %u (LOOM_TEST_SEED=%u replays it)\n", seed, seed);
  std::fflush(stdout);
  return seed;
}

inline std::string seed_note(uint32_t seed) {
  return "seed " + std::to_string(seed) + " (replay with LOOM_TEST_SEED=" + std::to_string(seed) +
         ")";
}

inline uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline constexpr uint64_t kStateSeed = 0x1234567;
inline constexpr uint64_t kDigestSeed = 0x7654321;

struct FakeModelKind {
  bool attention = true;
  bool linear = true;
};

inline uint64_t fake_state_step(uint64_t s, int32_t t, uint64_t a) {
  return mix(mix(s, static_cast<uint32_t>(t)), a);
}
inline uint64_t fake_kv(int32_t t, int32_t p, uint64_t a, uint64_t s) {
  return mix(mix(mix(static_cast<uint32_t>(t), p), a), s);
}
inline int32_t fake_sample(uint64_t s, uint64_t d, int32_t vocab) {
  return static_cast<int32_t>(mix(s, d) % vocab);
}

// Next token after `tokens`, computed from scratch.
inline int32_t fake_oracle_next(std::span<const int32_t> tokens, FakeModelKind k, int32_t vocab) {
  uint64_t s = k.linear ? kStateSeed : 0, d = kDigestSeed;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const uint64_t a = k.attention ? d : 0;
    if (k.linear) s = fake_state_step(s, tokens[p], a);
    const uint64_t kv = fake_kv(tokens[p], static_cast<int32_t>(p), a, s);
    if (k.attention) d = mix(d, kv);
  }
  return fake_sample(s, k.attention ? d : 0, vocab);
}

// `n` outputs of a request with `prompt`, from scratch.
inline std::vector<int32_t> fake_oracle_outputs(std::vector<int32_t> prompt, int32_t n,
                                                FakeModelKind k, int32_t vocab) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    out.push_back(fake_oracle_next(prompt, k, vocab));
    prompt.push_back(out.back());
  }
  return out;
}

// Runs plans on simulated memory. Freed pages and slots keep stale contents (random at start).
class FakeEngine {
 public:
  FakeEngine(const SchedulerConfig& cfg, int32_t vocab, uint64_t seed)
      : kind_{cfg.has_attention_layers, cfg.has_linear_layers},
        vocab_(vocab),
        page_size_(cfg.page_size) {
    kv_.assign(cfg.has_attention_layers ? cfg.num_pages : 0, std::vector<uint64_t>(cfg.page_size));
    for (auto& page : kv_)
      for (auto& v : page) v = seed = mix(seed, 1);
    slots_.resize(cfg.has_linear_layers ? cfg.num_state_slots : 0);
    for (auto& v : slots_) v = seed = mix(seed, 2);
  }
  FakeModelKind kind() const { return kind_; }

  // Runs `plan`; `stop(id, token)` says whether a sampled token finishes the request. Checks the
  // plan's num_output_tokens against the stream; appends sampled tokens to streams().
  template <typename StopFn>
  StepResult run(const BatchPlan& plan, StopFn stop, std::string* error) {
    StepResult res;
    for (const SeqPlan& q : plan.seqs) {
      SeqResult r;
      r.request_id = q.request_id;
      uint64_t s = 0, d = kDigestSeed;
      if (kind_.linear) {
        if (q.state_slot <= 0 || q.state_slot >= static_cast<int32_t>(slots_.size())) {
          *error = absl::StrFormat("bad state slot %d", q.state_slot);
          return res;
        }
        if (q.restore_from_slot >= 0) {
          slots_[q.state_slot] = slots_[q.restore_from_slot];
        } else if (q.fresh_state) {
          slots_[q.state_slot] = kStateSeed;
        }
        s = slots_[q.state_slot];
      }
      if (kind_.attention) {
        for (int32_t i = 0; i < q.start_pos; ++i)
          d = mix(d, kv_[q.page_table[i / page_size_]][i % page_size_]);
      }
      for (size_t j = 0; j < q.tokens.size(); ++j) {
        const int32_t p = q.start_pos + static_cast<int32_t>(j);
        const uint64_t a = kind_.attention ? d : 0;
        if (kind_.linear) s = fake_state_step(s, q.tokens[j], a);
        const uint64_t kv = fake_kv(q.tokens[j], p, a, s);
        if (kind_.attention) {
          kv_[q.page_table[p / page_size_]][p % page_size_] = kv;
          d = mix(d, kv);
        }
      }
      if (kind_.linear) {
        slots_[q.state_slot] = s;
        if (q.save_to_slot >= 0) slots_[q.save_to_slot] = s;
      }
      if (q.sample) {
        auto& stream = streams_[q.request_id];
        if (q.num_output_tokens != static_cast<int32_t>(stream.size())) {
          *error = absl::StrFormat("request %d: plan says %d outputs, %d streamed", q.request_id,
                                   q.num_output_tokens, stream.size());
        }
        const int32_t tok = fake_sample(s, kind_.attention ? d : 0, vocab_);
        stream.push_back(tok);
        r.token = tok;
        r.finished = stop(q.request_id, tok);
      }
      res.seqs.push_back(r);
    }
    return res;
  }
  absl::flat_hash_map<uint64_t, std::vector<int32_t>>& streams() { return streams_; }
  // The simulated memory: each page's rows, each slot's state (FakeOffload copies them).
  std::vector<std::vector<uint64_t>>& pages() { return kv_; }
  std::vector<uint64_t>& slots() { return slots_; }

 private:
  FakeModelKind kind_;
  int32_t vocab_;
  int32_t page_size_;
  std::vector<std::vector<uint64_t>> kv_;
  std::vector<uint64_t> slots_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> streams_;
};

// An offload tier (sequence_offload.h) over a FakeEngine's memory, for the prefix cache: a blob is
// a copy of its pages' rows and its slot's state. At most `capacity` blobs: the oldest unheld are
// dropped and reported by take_evicted(). `lose_percent` of restores report lost bytes after
// scribbling over the ids they were given (what a caller must then never read).
class FakeOffload final : public SequenceOffload {
 public:
  FakeOffload(int32_t capacity, uint64_t seed, int lose_percent = 0)
      : capacity_(capacity), rng_(seed), lose_percent_(lose_percent) {}
  void attach(FakeEngine* engine) { engine_ = engine; }

  bool offload(uint64_t key, std::span<const int32_t> pages, int32_t slot,
               int32_t num_computed) override {
    drop(key);
    while (static_cast<int32_t>(blobs_.size()) >= capacity_) {
      auto it = std::find_if(order_.begin(), order_.end(),
                             [&](const auto& e) { return !blobs_.at(e.second).held; });
      if (it == order_.end()) return false;
      evicted_.push_back(it->second);
      ++evictions;
      drop(it->second);
    }
    Blob b;
    b.num_computed = num_computed;
    for (int32_t p : pages) b.pages.push_back(engine_->pages()[p]);
    b.has_slot = slot >= 0;
    if (b.has_slot) b.slot = engine_->slots()[slot];
    b.tick = ++tick_;
    order_.emplace(b.tick, key);
    blobs_.emplace(key, std::move(b));
    ++stored;
    return true;
  }
  std::optional<Held> hold(uint64_t key) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return std::nullopt;
    it->second.held = true;
    return Held{it->second.num_computed, static_cast<int32_t>(it->second.pages.size()),
                it->second.has_slot};
  }
  void release(uint64_t key) override {
    if (auto it = blobs_.find(key); it != blobs_.end()) it->second.held = false;
  }
  bool restore(uint64_t key, std::span<const int32_t> pages, int32_t slot) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return false;
    const bool lost = static_cast<int>(rng_() % 100) < lose_percent_;
    for (size_t i = 0; i < pages.size(); ++i) {
      std::vector<uint64_t>& rows = engine_->pages()[pages[i]];
      if (lost) {
        for (uint64_t& v : rows) v = rng_();
      } else {
        rows = it->second.pages.at(i);
      }
    }
    if (slot >= 0) engine_->slots()[slot] = lost ? rng_() : it->second.slot;
    drop(key);
    ++(lost ? losses : restores);
    return !lost;
  }
  void drop(uint64_t key) override {
    auto it = blobs_.find(key);
    if (it == blobs_.end()) return;
    order_.erase(it->second.tick);
    blobs_.erase(it);
  }
  void clear() override {
    blobs_.clear();
    order_.clear();
    evicted_.clear();
  }
  std::vector<uint64_t> take_evicted() override { return std::exchange(evicted_, {}); }

  int32_t size() const { return static_cast<int32_t>(blobs_.size()); }
  int64_t stored = 0, restores = 0, losses = 0, evictions = 0;

 private:
  struct Blob {
    std::vector<std::vector<uint64_t>> pages;
    uint64_t slot = 0;
    bool has_slot = false;
    int32_t num_computed = 0;
    uint64_t tick = 0;
    bool held = false;
  };
  const int32_t capacity_;
  std::mt19937_64 rng_;
  const int lose_percent_;
  FakeEngine* engine_ = nullptr;
  absl::flat_hash_map<uint64_t, Blob> blobs_;
  std::map<uint64_t, uint64_t> order_;  // tick -> key, oldest first
  std::vector<uint64_t> evicted_;
  uint64_t tick_ = 0;
};

// Reconciles every pool reference count against its owners (live requests, prefix-cache entries)
// and checks the plan (if any) against the limits. Returns "" when everything holds.
inline std::string audit(const Scheduler& s, const BatchPlan* plan) {
  const KvPagePool& kv = s.kv_pool();
  const StateSlotPool& slots = s.slot_pool();
  std::vector<int32_t> page_refs(kv.end_id(), 0), slot_refs(slots.end_id(), 0);
  std::string err;
  auto add_slot = [&](int32_t id, const char* what) {
    if (id < 0) return;
    if (id < slots.first_id() || id >= slots.end_id()) {
      err += absl::StrFormat("%s slot %d out of range; ", what, id);
      return;
    }
    ++slot_refs[id];
  };
  absl::flat_hash_map<int32_t, uint64_t> live_slot_owner;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> held_pages;  // page ids of each request
  s.for_each_request([&](const RequestView& r) {
    for (const IdPool::Handle& p : r.pages) held_pages[r.id].push_back(p.id());
    if (!r.running && (!r.pages.empty() || r.state_slot >= 0 || r.num_computed != 0)) {
      err += absl::StrFormat("waiting request %d holds resources; ", r.id);
    }
    absl::flat_hash_set<int32_t> own;
    for (const IdPool::Handle& p : r.pages) {
      if (p.id() == KvPagePool::kScratchPage) {
        err += absl::StrFormat("request %d holds the scratch page; ", r.id);
        continue;
      }
      ++page_refs[p.id()];
      if (!own.insert(p.id()).second) err += absl::StrFormat("request %d: page twice; ", r.id);
    }
    add_slot(r.state_slot, "state");
    add_slot(r.restore_slot, "restore");
    add_slot(r.save_slot, "save");
    if (r.state_slot >= 0 && !live_slot_owner.emplace(r.state_slot, r.id).second) {
      err += absl::StrFormat("state slot %d owned twice; ", r.state_slot);
    }
  });
  if (s.prefix_cache()) {
    s.prefix_cache()->for_each_entry([&](int32_t page, int32_t ckpt, int32_t) {
      if (page >= 0) ++page_refs[page];
      add_slot(ckpt, "checkpoint");
    });
  }
  int32_t used = 0;
  for (int32_t id = kv.first_id(); id < kv.end_id(); ++id) {
    if (kv.ref_count(id) != page_refs[id]) {
      err += absl::StrFormat("page %d: pool count %d, owners %d; ", id, kv.ref_count(id),
                             page_refs[id]);
    }
    used += page_refs[id] > 0;
  }
  if (kv.free_count() != kv.capacity() - used) err += "page free count mismatch; ";
  used = 0;
  for (int32_t id = slots.first_id(); id < slots.end_id(); ++id) {
    if (slots.ref_count(id) != slot_refs[id]) {
      err += absl::StrFormat("slot %d: pool count %d, owners %d; ", id, slots.ref_count(id),
                             slot_refs[id]);
    }
    used += slot_refs[id] > 0;
  }
  if (slots.free_count() != slots.capacity() - used) err += "slot free count mismatch; ";
  for (const auto& [slot, id] : live_slot_owner) {
    if (slots.ref_count(slot) != 1) err += absl::StrFormat("live slot %d shared; ", slot);
  }
  if (plan) {
    const SchedulerConfig& c = s.config();
    if (static_cast<int32_t>(plan->seqs.size()) > c.max_num_seqs) err += "too many seqs; ";
    int32_t total = 0;
    bool seen_prefill = false;
    absl::flat_hash_map<int32_t, int> plan_slots;
    absl::flat_hash_map<uint64_t, int> plan_ids;
    for (const SeqPlan& q : plan->seqs) {
      const int32_t n = static_cast<int32_t>(q.tokens.size());
      total += n;
      if (n == 0) err += "empty sequence; ";
      if (!plan_ids.emplace(q.request_id, 1).second) err += "request twice in a plan; ";
      if (q.is_decode && seen_prefill) err += "decode after a prefill; ";
      if (q.is_decode && n != 1) err += "decode of more than one token; ";
      seen_prefill |= !q.is_decode;
      if (c.has_linear_layers) {
        if (q.state_slot <= 0) err += "missing or scratch state slot; ";
        if (!plan_slots.emplace(q.state_slot, 1).second) err += "state slot twice in a plan; ";
      }
      if (q.save_to_slot >= 0 && (q.start_pos + n) % c.page_size != 0) {
        err += "checkpoint save off a block boundary; ";
      }
      if (q.restore_from_slot >= 0 && q.start_pos % c.page_size != 0) err += "bad restore; ";
      if (c.has_attention_layers) {
        const int32_t want = (q.start_pos + n + c.page_size - 1) / c.page_size;
        const bool scratch = std::find(q.page_table.begin(), q.page_table.end(),
                                       KvPagePool::kScratchPage) != q.page_table.end();
        auto held = held_pages.find(q.request_id);
        if (held == held_pages.end() || !std::equal(q.page_table.begin(), q.page_table.end(),
                                                    held->second.begin(), held->second.end())) {
          err +=
              absl::StrFormat("request %d: page table is not the pages it holds; ", q.request_id);
        }
        if (scratch) {
          err += absl::StrFormat("request %d: scratch page in its page table; ", q.request_id);
        } else if (static_cast<int32_t>(q.page_table.size()) != want) {
          err += absl::StrFormat("request %d: page table %d pages, want %d; ", q.request_id,
                                 q.page_table.size(), want);
        } else {
          for (int32_t pg = q.start_pos / c.page_size; pg < want; ++pg) {
            if (kv.ref_count(q.page_table[pg]) != 1) {
              err += absl::StrFormat("request %d writes shared page %d; ", q.request_id,
                                     q.page_table[pg]);
            }
          }
        }
      }
    }
    if (total != plan->num_batched_tokens) err += "num_batched_tokens mismatch; ";
    if (total > c.max_num_batched_tokens) {
      err += absl::StrFormat("%d tokens over budget %d; ", total, c.max_num_batched_tokens);
    }
  }
  return err;
}

// Drives a Scheduler with a FakeEngine and checks after every step: audit() after schedule() and
// after complete(), plus every output stream against the oracle.
class Driver {
 public:
  Driver(const SchedulerConfig& cfg, uint64_t seed, int32_t vocab = 997)
      : engine_(cfg, vocab, seed), vocab_(vocab) {
    auto s = Scheduler::create(cfg);
    if (!s.ok()) std::abort();
    sched_ = std::move(s).value();
  }
  Scheduler& sched() { return *sched_; }
  FakeEngine& engine() { return engine_; }

  absl::Status add(uint64_t id, std::vector<int32_t> prompt, int32_t max_new,
                   int32_t priority = 0) {
    prompts_[id] = prompt;
    max_new_[id] = max_new;
    return sched_->add({id, std::move(prompt), max_new, priority});
  }
  absl::Status cancel(uint64_t id) {
    absl::Status st = sched_->cancel(id);
    if (st.ok()) cancelled_.insert(id);
    return st;
  }

  // One schedule/run/complete round. `stop` decides engine-side finishes; `between` runs after
  // schedule() and before complete() (e.g. to cancel in-flight requests). "" when all checks hold.
  std::string step(std::function<bool(uint64_t, int32_t)> stop = nullptr,
                   std::function<void(const BatchPlan&)> between = nullptr) {
    plan_ = sched_->schedule();
    std::string err = audit(*sched_, &plan_);
    if (!err.empty()) return "after schedule: " + err;
    for (uint64_t id : plan_.preempted) ++preemptions_[id];
    if (between) between(plan_);
    auto no_stop = [](uint64_t, int32_t) { return false; };
    StepResult res = stop ? engine_.run(plan_, stop, &err) : engine_.run(plan_, no_stop, &err);
    if (!err.empty()) return err;
    auto done = sched_->complete(res);
    if (!done.ok()) return std::string(done.status().message());
    for (const FinishedRequest& f : *done) {
      if (!finished_.emplace(f.request_id, f).second) return "finished twice";
      if (f.num_output_tokens != static_cast<int32_t>(engine_.streams()[f.request_id].size())) {
        return "finished with a different output count than streamed";
      }
    }
    err = audit(*sched_, nullptr);
    return err.empty() ? err : "after complete: " + err;
  }

  // Every finished request's stream equals the oracle's (length-finished ones have exactly
  // max_new tokens); cancelled ones hold a prefix of it.
  std::string check_outputs() {
    for (auto& [id, stream] : engine_.streams()) {
      const auto want = fake_oracle_outputs(prompts_.at(id), static_cast<int32_t>(stream.size()),
                                            engine_.kind(), vocab_);
      if (want != stream) return absl::StrFormat("request %d: outputs differ from oracle", id);
      auto f = finished_.find(id);
      if (f != finished_.end() && f->second.cause == SchedFinish::kLength &&
          static_cast<int32_t>(stream.size()) != max_new_.at(id)) {
        return absl::StrFormat("request %d: %d outputs, max_new_tokens %d", id, stream.size(),
                               max_new_.at(id));
      }
    }
    return "";
  }

  const BatchPlan& plan() const { return plan_; }
  const absl::flat_hash_map<uint64_t, FinishedRequest>& finished() const { return finished_; }
  const absl::flat_hash_set<uint64_t>& cancelled() const { return cancelled_; }
  const absl::flat_hash_map<uint64_t, int>& preemptions() const { return preemptions_; }
  std::vector<int32_t>& stream(uint64_t id) { return engine_.streams()[id]; }

 private:
  std::unique_ptr<Scheduler> sched_;
  FakeEngine engine_;
  int32_t vocab_;
  BatchPlan plan_;
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> prompts_;
  absl::flat_hash_map<uint64_t, int32_t> max_new_;
  absl::flat_hash_map<uint64_t, FinishedRequest> finished_;
  absl::flat_hash_set<uint64_t> cancelled_;
  absl::flat_hash_map<uint64_t, int> preemptions_;
};

}  // namespace loom::scheduler_testing
