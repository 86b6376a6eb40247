#include "scheduler/scheduler.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace loom {
namespace {

// Queue order: higher priority first, then earlier arrival (FCFS).
struct QueueKey {
  int32_t priority;
  uint64_t arrival;
  bool operator<(const QueueKey& o) const {
    return priority != o.priority ? priority > o.priority : arrival < o.arrival;
  }
};

struct Req {
  uint64_t id = 0;
  int32_t priority = 0;
  uint64_t arrival = 0;         // unique, increasing with add()
  std::vector<int32_t> tokens;  // prompt + outputs
  int32_t prompt_len = 0;
  int32_t max_new_tokens = 1;
  uint64_t park_key = 0;
  bool running = false;
  int32_t num_computed = 0;  // tokens in cache
  int32_t prefill_len = 0;   // tokens known at (re)admission; prefill done at num_computed == it
  std::vector<IdPool::Handle> pages;
  // The ids of `pages`, in order: the table a SeqPlan views. Appended in emit(), as pages only
  // grow while a request runs.
  std::vector<int32_t> page_ids;
  IdPool::Handle slot;
  IdPool::Handle restore;  // checkpoint share, from admission until the first chunk completes
  IdPool::Handle save;     // checkpoint slot the in-flight step writes
  std::vector<BlockHash> hashes;        // chain hashes of the full blocks of tokens (grows)
  std::vector<int32_t> ckpt_positions;  // pending checkpoint positions of this prefill, ascending
  int32_t num_preemptions = 0;
  int32_t pending_hit = 0;  // prefix-hit tokens of the admission, reported with the first chunk
  uint64_t scheduled_step = 0;

  QueueKey key() const { return {priority, arrival}; }
  int32_t num_outputs() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  bool decoding() const { return running && num_computed >= prefill_len; }
};

// One sequence of the in-flight plan.
struct Inflight {
  uint64_t id;
  uint64_t arrival;  // tells a cancelled-and-re-added id apart
  int32_t num_tokens;
  bool sample;
  bool decode;
};

}  // namespace

struct Scheduler::Impl {
  // Constant after create().
  SchedulerConfig cfg;
  // Declaration order matters: requests and the cache hold handles into the pools, so they are
  // destroyed first.
  std::unique_ptr<KvPagePool> kv;
  std::unique_ptr<StateSlotPool> slots;
  std::unique_ptr<PrefixCache> cache;  // null when prefix caching is off
  std::unique_ptr<ParkedSequences> parked;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Req>> reqs;
  std::map<QueueKey, Req*> waiting;
  std::map<QueueKey, Req*> running;
  uint64_t next_arrival = 1;
  uint64_t step = 0;
  bool in_flight = false;
  std::vector<Inflight> inflight;
  // Page tables of requests freed while their step is in flight: the plan still views them.
  std::vector<std::vector<int32_t>> retired_tables;

  int32_t bs() const { return cfg.page_size; }
  bool use_ckpts() const { return cache && cfg.has_linear_layers; }

  // Unused prefix-cache entries go first, then parked session sequences (least recently parked
  // first): a parked sequence is a conversation's whole state, a cache entry one more prefix.
  void ensure_free_pages(int32_t n) {
    while (kv->free_count() < n && ((cache && cache->evict_for_page()) || parked->evict_lru())) {
    }
  }
  IdPool::Handle alloc_page() {
    ensure_free_pages(1);
    return kv->allocate_one();
  }
  IdPool::Handle alloc_slot() {
    while (slots->free_count() == 0 &&
           ((cache && cache->evict_for_slot()) || parked->evict_lru())) {
    }
    return slots->allocate_one();
  }
  // Pages eviction might free (an upper bound: parked pages may be shared with the cache).
  int32_t evictable_pages() const {
    return (cache ? cache->count_evictable_pages() : 0) + parked->pages();
  }
  bool slot_obtainable() const {
    return slots->free_count() > 0 || (cache && cache->has_evictable_checkpoint()) ||
           parked->slots() > 0;
  }

  void release_resources(Req* r) {
    r->pages.clear();
    r->page_ids.clear();
    r->slot.reset();
    r->restore.reset();
    r->save.reset();
    r->ckpt_positions.clear();
    r->num_computed = 0;
  }

  void free_request(Req* r) {
    if (in_flight && r->scheduled_step == step) retired_tables.push_back(std::move(r->page_ids));
    release_resources(r);
    (r->running ? running : waiting).erase(r->key());
    reqs.erase(r->id);  // destroys r
  }

  // A finished session turn: its full blocks go to the prefix cache (a recompute after an
  // eviction then starts from them where a checkpoint allows), its pages and slot are parked.
  bool park(Req* r) {
    if (cfg.offload != nullptr) cfg.offload->drop(r->park_key);  // superseded by this turn's end
    if (cache) {
      cache->hash_blocks(std::span<const int32_t>(r->tokens).first(r->num_computed), &r->hashes);
      if (cfg.has_attention_layers)
        cache->insert(r->tokens, r->hashes, r->num_computed / bs(), r->pages, IdPool::Handle());
    }
    ParkedSequence p;
    p.pages = std::move(r->pages);
    p.slot = std::move(r->slot);
    p.num_computed = r->num_computed;
    return parked->park(r->park_key, std::move(p));
  }

  void preempt(Req* v, BatchPlan* plan) {
    LOOM_CHECK(v->running && v->scheduled_step != step, "preempting request %d",
               static_cast<int>(v->id));
    release_resources(v);
    running.erase(v->key());
    v->running = false;
    ++v->num_preemptions;
    waiting.emplace(v->key(), v);
    plan->preempted.push_back(v->id);
  }

  // Lowest-priority, latest-arrived running request not yet in this step's plan.
  Req* pick_victim() {
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      if (it->second->scheduled_step != step) return it->second;
    }
    return nullptr;
  }

  // Gives running request r pages for positions [0, total). Preempts (recompute) the lowest
  // unscheduled running requests until they fit; false if r itself had to go.
  bool reserve_pages(Req* r, int32_t total, BatchPlan* plan) {
    if (!cfg.has_attention_layers) return true;
    const int32_t need = kv->pages_for_tokens(total) - static_cast<int32_t>(r->pages.size());
    if (need <= 0) return true;
    while (true) {
      ensure_free_pages(need);
      if (kv->allocate(need, &r->pages)) return true;
      Req* v = pick_victim();
      LOOM_CHECK(v != nullptr, "no victim while request %d is unscheduled",
                 static_cast<int>(r->id));
      preempt(v, plan);
      if (v == r) return false;
    }
  }

  // Prefill chunk length for r: the budget, cut at the next checkpoint position.
  int32_t chunk_len(const Req* r, int32_t budget) const {
    int32_t n = std::min(r->prefill_len - r->num_computed, budget);
    for (int32_t p : r->ckpt_positions) {
      if (p <= r->num_computed) continue;
      n = std::min(n, p - r->num_computed);
      break;
    }
    return n;
  }

  void emit(Req* r, int32_t n, bool decode, BatchPlan* plan) {
    SeqPlan s;
    s.request_id = r->id;
    s.state_slot = r->slot.id();
    const int32_t end = r->num_computed + n;
    if (cfg.has_attention_layers) {
      LOOM_CHECK(static_cast<int32_t>(r->pages.size()) == kv->pages_for_tokens(end),
                 "request %d holds %zu pages for %d tokens", static_cast<int>(r->id),
                 r->pages.size(), end);
      LOOM_CHECK(
          r->page_ids.size() <= r->pages.size() &&
              (r->page_ids.empty() || r->page_ids.back() == r->pages[r->page_ids.size() - 1].id()),
          "request %d: page table out of step with its pages", static_cast<int>(r->id));
      for (size_t i = r->page_ids.size(); i < r->pages.size(); ++i)
        r->page_ids.push_back(r->pages[i].id());
      s.page_table = r->page_ids;
    }
    s.start_pos = r->num_computed;
    s.tokens.assign(r->tokens.begin() + r->num_computed, r->tokens.begin() + end);
    s.is_decode = decode;
    s.sample = end == static_cast<int32_t>(r->tokens.size());
    s.fresh_state = r->num_computed == 0;
    s.restore_from_slot = r->restore.id();
    LOOM_CHECK(!r->restore.valid() || !decode, "restore on a decode");
    if (!decode && use_ckpts() &&
        std::find(r->ckpt_positions.begin(), r->ckpt_positions.end(), end) !=
            r->ckpt_positions.end()) {
      r->save = alloc_slot();  // none free: the checkpoint is skipped, the chunk still ends here
      s.save_to_slot = r->save.id();
    }
    s.num_output_tokens = r->num_outputs();
    s.prefix_hit_tokens = std::exchange(r->pending_hit, 0);
    r->scheduled_step = step;
    plan->num_batched_tokens += n;
    inflight.push_back({r->id, r->arrival, n, s.sample, decode});
    plan->seqs.push_back(std::move(s));
  }

  // Admits waiting request r with a first chunk of at most `budget` tokens if its slot and the
  // chunk's pages are available (after evicting unused prefix-cache entries). Returns the chunk
  // length, or 0 when r was not admitted.
  int32_t admit(Req* r, int32_t budget) {
    if (r->park_key != 0) {
      if (std::optional<ParkedSequence> p = parked->take(r->park_key)) {
        if (p->num_computed < static_cast<int32_t>(r->tokens.size())) return resume(r, *p, budget);
        // else a sequence longer than the turn's tokens: not this session's, dropped
      } else if (cfg.offload != nullptr) {
        if (std::optional<int32_t> n = restore(r, budget)) return *n;
      }
    }
    PrefixCache::Match m;
    if (cache) {
      cache->hash_blocks(r->tokens, &r->hashes);
      m = cache->match(r->tokens, r->hashes);
    }
    const int32_t known = static_cast<int32_t>(r->tokens.size());
    std::vector<int32_t> ckpts;
    int32_t n = 0, need = 0;
    // The first chunk (the rule of chunk_len: every pending checkpoint lies past m.length) and the
    // pages it needs beyond the match's (those of the match still offloaded included).
    auto first_chunk = [&] {
      ckpts = checkpoint_positions(known, m.length, m.shared_length);
      n = std::min(known - m.length, budget);
      if (!ckpts.empty()) n = std::min(n, ckpts.front() - m.length);
      need = cfg.has_attention_layers ? kv->pages_for_tokens(m.length + n) -
                                            static_cast<int32_t>(m.pages.size()) + m.offloaded_pages
                                      : 0;
    };
    // Evict nothing for an admission that cannot succeed anyway (keeps the cache warm while the
    // queue head waits for memory).
    auto fits = [&] {
      return need <= kv->free_count() + evictable_pages() &&
             (!cfg.has_linear_layers || slot_obtainable());
    };
    first_chunk();
    if (!fits()) return 0;
    if (m.offloaded_pages > 0 || m.offloaded_checkpoint) {
      // Blocks that live only in the offload tier come back into fresh ids (or m is cut short).
      cache->restore(
          &m, {.page = [this] { return alloc_page(); }, .slot = [this] { return alloc_slot(); }});
      first_chunk();
      if (!fits()) return 0;
    }
    std::vector<IdPool::Handle> pages = std::move(m.pages);
    IdPool::Handle slot;
    if (cfg.has_linear_layers) {
      slot = alloc_slot();
      if (!slot.valid()) return 0;
    }
    if (cfg.has_attention_layers) {
      ensure_free_pages(need);
      if (!kv->allocate(need, &pages)) return 0;
    }
    r->pages = std::move(pages);
    r->slot = std::move(slot);
    r->restore = std::move(m.checkpoint);
    r->num_computed = m.length;
    r->pending_hit = m.length;
    r->prefill_len = known;
    r->ckpt_positions = std::move(ckpts);
    start_running(r);
    return n;
  }

  // Checkpoint positions of a prefill of `known` tokens from `start`: every checkpoint_interval-th
  // block boundary, the end of the prefix the cache holds without a checkpoint (`shared`, the
  // match's shared_length: where this prompt departs from an earlier one, so that the next prompt
  // sharing it hits however sparse the interval) and the last full block's end, past `start`.
  std::vector<int32_t> checkpoint_positions(int32_t known, int32_t start, int32_t shared) const {
    std::vector<int32_t> ckpts;
    if (!use_ckpts()) return ckpts;
    const int32_t last_full = known / bs();
    for (int32_t b = 1; b <= last_full; ++b) {
      if ((b % cfg.checkpoint_interval == 0 || b == last_full || b * bs() == shared) &&
          b * bs() > start) {
        ckpts.push_back(b * bs());
      }
    }
    return ckpts;
  }

  void start_running(Req* r) {
    waiting.erase(r->key());
    r->running = true;
    running.emplace(r->key(), r);
  }

  // Admission of a session turn from the sequence offloaded under its key: a slot and the
  // sequence's pages are allocated (evicting and offloading others as any allocation does), its
  // bytes copied back, and it resumes as a parked sequence would. 0: the memory cannot be had
  // now, the sequence stays offloaded and r waits. nullopt: nothing is offloaded under the key,
  // or its bytes are lost; r is admitted as any request.
  std::optional<int32_t> restore(Req* r, int32_t budget) {
    SequenceOffload& tier = *cfg.offload;
    const std::optional<SequenceOffload::Held> held = tier.hold(r->park_key);
    if (!held) return std::nullopt;
    // Longer than the turn's tokens (not this session's), or not a sequence of this model.
    if (held->num_computed >= static_cast<int32_t>(r->tokens.size()) ||
        held->has_slot != cfg.has_linear_layers ||
        (cfg.has_attention_layers && held->num_pages < kv->pages_for_tokens(held->num_computed))) {
      tier.drop(r->park_key);
      return std::nullopt;
    }
    ParkedSequence p;
    p.num_computed = held->num_computed;
    const int32_t need = cfg.has_attention_layers ? held->num_pages : 0;
    const bool wants_slot = cfg.has_linear_layers;
    if (need > kv->free_count() + evictable_pages() || (wants_slot && !slot_obtainable())) {
      tier.release(r->park_key);
      return 0;
    }
    if (wants_slot) p.slot = alloc_slot();
    if (need > 0) {
      ensure_free_pages(need);
      kv->allocate(need, &p.pages);
    }
    if ((wants_slot && !p.slot.valid()) || static_cast<int32_t>(p.pages.size()) != need) {
      tier.release(r->park_key);
      return 0;  // what was allocated goes back with `p`
    }
    std::vector<int32_t> ids;
    ids.reserve(p.pages.size());
    for (const IdPool::Handle& h : p.pages) ids.push_back(h.id());
    if (!tier.restore(r->park_key, ids, p.slot.id())) return std::nullopt;
    return resume(r, p, budget);
  }

  // Admission of a session turn from its parked sequence `p`: its pages and its slot (the state at
  // exactly p.num_computed) become r's, and the prefill starts there. When the first chunk's pages
  // cannot be had, `p` goes back to its place and r waits.
  int32_t resume(Req* r, ParkedSequence& p, int32_t budget) {
    const int32_t known = static_cast<int32_t>(r->tokens.size());
    const int32_t start = p.num_computed;
    std::vector<int32_t> ckpts = checkpoint_positions(known, start, /*shared=*/0);
    int32_t n = std::min(known - start, budget);
    if (!ckpts.empty()) n = std::min(n, ckpts.front() - start);
    if (cfg.has_attention_layers) {
      const int32_t need = kv->pages_for_tokens(start + n) - static_cast<int32_t>(p.pages.size());
      if (need > 0) {
        if (need <= kv->free_count() + evictable_pages()) ensure_free_pages(need);
        if (!kv->allocate(need, &p.pages)) {
          parked->put_back(r->park_key, std::move(p));
          return 0;
        }
      }
    }
    if (cache) cache->hash_blocks(r->tokens, &r->hashes);
    r->pages = std::move(p.pages);
    r->slot = std::move(p.slot);
    r->restore.reset();
    r->num_computed = start;
    r->pending_hit = start;
    r->prefill_len = known;
    r->ckpt_positions = std::move(ckpts);
    start_running(r);
    return n;
  }
};

Scheduler::Scheduler() : impl_(std::make_unique<Impl>()) {}
Scheduler::~Scheduler() = default;

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerConfig& c) {
  if (c.max_num_batched_tokens < 1 || c.max_num_seqs < 1 || c.page_size < 1 ||
      c.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        "scheduler: max_num_batched_tokens, max_num_seqs, page_size, checkpoint_interval must "
        "be >= 1");
  }
  if (!c.has_attention_layers && !c.has_linear_layers) {
    return absl::InvalidArgumentError(
        "scheduler: the model has neither attention nor linear layers");
  }
  if (c.has_attention_layers && c.num_pages < 2) {
    return absl::InvalidArgumentError(
        "scheduler: attention layers need num_pages >= 2 (page 0 is scratch)");
  }
  if (c.has_linear_layers && c.num_state_slots < 2) {
    return absl::InvalidArgumentError(
        "scheduler: linear layers need num_state_slots >= 2 (slot 0 is scratch)");
  }
  std::unique_ptr<Scheduler> s(new Scheduler());
  Impl& m = *s->impl_;
  m.cfg = c;
  m.kv = std::make_unique<KvPagePool>(c.has_attention_layers ? c.num_pages : 0, c.page_size);
  m.slots = std::make_unique<StateSlotPool>(c.has_linear_layers ? c.num_state_slots : 0);
  if (c.enable_prefix_cache) {
    PrefixCacheOptions o;
    o.block_size = c.page_size;
    o.has_pages = c.has_attention_layers;
    o.has_checkpoints = c.has_linear_layers;
    o.hash = c.block_hash;
    o.offload = c.prefix_offload;
    m.cache = std::make_unique<PrefixCache>(o);
  }
  m.parked = std::make_unique<ParkedSequences>(c.parking, c.offload);
  return s;
}

absl::Status Scheduler::add(SchedRequest request) {
  Impl& m = *impl_;
  if (m.reqs.contains(request.id)) {
    return absl::InvalidArgumentError(absl::StrFormat("request id %d is already live", request.id));
  }
  if (request.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (request.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  const int64_t positions =
      static_cast<int64_t>(request.prompt.size()) + request.max_new_tokens - 1;
  if (positions > std::numeric_limits<int32_t>::max() / 2) {
    return absl::InvalidArgumentError("prompt + max_new_tokens too long");
  }
  if (m.cfg.has_attention_layers && m.kv->pages_for_tokens(positions) > m.kv->capacity()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt (%d) + max_new_tokens (%d) needs %d KV pages; the cache has %d",
                        request.prompt.size(), request.max_new_tokens,
                        m.kv->pages_for_tokens(positions), m.kv->capacity()));
  }
  auto r = std::make_unique<Req>();
  r->id = request.id;
  r->priority = request.priority;
  r->arrival = m.next_arrival++;
  r->prompt_len = static_cast<int32_t>(request.prompt.size());
  r->tokens = std::move(request.prompt);
  r->max_new_tokens = request.max_new_tokens;
  r->park_key = request.park_key;
  m.waiting.emplace(r->key(), r.get());
  m.reqs.emplace(r->id, std::move(r));
  return absl::OkStatus();
}

absl::Status Scheduler::cancel(uint64_t id) {
  Impl& m = *impl_;
  auto it = m.reqs.find(id);
  if (it == m.reqs.end()) {
    return absl::NotFoundError(absl::StrFormat("request %d is not live", id));
  }
  m.free_request(it->second.get());
  return absl::OkStatus();
}

BatchPlan Scheduler::schedule() {
  Impl& m = *impl_;
  LOOM_CHECK(!m.in_flight, "schedule() before complete() of step %d", static_cast<int>(m.step));
  m.in_flight = true;
  m.inflight.clear();
  BatchPlan plan;
  plan.step = ++m.step;
  int32_t budget = m.cfg.max_num_batched_tokens;
  auto full = [&] {
    return budget == 0 || static_cast<int32_t>(plan.seqs.size()) >= m.cfg.max_num_seqs;
  };
  std::vector<Req*> order;
  order.reserve(m.running.size());
  for (auto& [key, r] : m.running) order.push_back(r);

  // 1. Decodes: one token each, highest priority first.
  for (Req* r : order) {
    if (full()) break;
    if (!r->decoding()) continue;
    LOOM_CHECK(static_cast<int32_t>(r->tokens.size()) == r->num_computed + 1,
               "decode of request %d: %zu tokens, %d computed", static_cast<int>(r->id),
               r->tokens.size(), r->num_computed);
    if (!m.reserve_pages(r, r->num_computed + 1, &plan)) continue;
    m.emit(r, 1, /*decode=*/true, &plan);
    budget -= 1;
  }
  // 2. Running partial prefills continue.
  for (Req* r : order) {
    if (full()) break;
    if (!r->running || r->decoding() || r->scheduled_step == m.step) continue;
    const int32_t n = m.chunk_len(r, budget);
    if (!m.reserve_pages(r, r->num_computed + n, &plan)) continue;
    m.emit(r, n, /*decode=*/false, &plan);
    budget -= n;
  }
  // 3. Admissions, in queue order, stopping at the first that does not fit. None in a step that
  // preempted: memory is short, and the preempted would otherwise be readmitted at once.
  if (plan.preempted.empty()) {
    std::vector<Req*> queue;
    for (auto& [key, r] : m.waiting) queue.push_back(r);
    for (Req* r : queue) {
      if (full()) break;
      const int32_t n = m.admit(r, budget);
      if (n == 0) break;
      m.emit(r, n, /*decode=*/false, &plan);
      budget -= n;
    }
  }
  LOOM_CHECK(plan.num_batched_tokens <= m.cfg.max_num_batched_tokens, "%d tokens > budget %d",
             plan.num_batched_tokens, m.cfg.max_num_batched_tokens);
  return plan;
}

absl::StatusOr<std::vector<FinishedRequest>> Scheduler::complete(const StepResult& result) {
  Impl& m = *impl_;
  if (!m.in_flight) return absl::FailedPreconditionError("complete() without a scheduled step");
  auto live = [&](const Inflight& f) -> Req* {
    auto it = m.reqs.find(f.id);
    return it != m.reqs.end() && it->second->arrival == f.arrival ? it->second.get() : nullptr;
  };
  // Validate everything first.
  absl::flat_hash_map<uint64_t, const SeqResult*> by_id;
  for (const SeqResult& s : result.seqs) {
    if (!by_id.emplace(s.request_id, &s).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("two results for request %d", s.request_id));
    }
  }
  size_t matched = 0;
  for (const Inflight& f : m.inflight) {
    auto it = by_id.find(f.id);
    if (it != by_id.end()) ++matched;
    if (!live(f)) continue;  // cancelled meanwhile: its result, if any, is ignored
    if (it == by_id.end()) {
      return absl::InvalidArgumentError(absl::StrFormat("no result for request %d", f.id));
    }
    if (it->second->token.has_value() != f.sample) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d: token %s but the plan %s sample", f.id,
          it->second->token.has_value() ? "present" : "missing", f.sample ? "did" : "did not"));
    }
  }
  if (matched != by_id.size()) {
    return absl::InvalidArgumentError("a result names a request that was not in the plan");
  }
  m.in_flight = false;

  std::vector<FinishedRequest> finished;
  for (const Inflight& f : m.inflight) {
    Req* r = live(f);
    if (!r) continue;
    const SeqResult& res = *by_id.at(f.id);
    r->num_computed += f.num_tokens;
    r->restore.reset();
    if (!f.decode) {
      while (!r->ckpt_positions.empty() && r->ckpt_positions.front() <= r->num_computed) {
        r->ckpt_positions.erase(r->ckpt_positions.begin());
      }
      if (m.cache) {
        IdPool::Handle save = std::move(r->save);
        const int32_t done = std::min(r->num_computed, r->prefill_len);
        int32_t blocks = 0;
        if (m.cfg.has_attention_layers) {
          blocks = done / m.bs();
        } else if (save.valid()) {
          blocks = done / m.bs();  // linear-only: entries only up to a checkpoint
        }
        LOOM_CHECK(!save.valid() || done % m.bs() == 0, "checkpoint at %d", done);
        if (blocks > 0) m.cache->insert(r->tokens, r->hashes, blocks, r->pages, std::move(save));
      }
    }
    r->save.reset();
    if (res.token) r->tokens.push_back(*res.token);
    if (res.finished || r->num_outputs() >= r->max_new_tokens) {
      const SchedFinish cause = res.finished ? SchedFinish::kByEngine : SchedFinish::kLength;
      FinishedRequest f{r->id, cause, r->num_outputs()};
      if (r->park_key != 0) {
        f.parked = m.park(r);
        f.tokens = std::move(r->tokens);
      }
      finished.push_back(std::move(f));
      m.free_request(r);
    }
  }
  m.inflight.clear();
  m.retired_tables.clear();
  return finished;
}

int32_t Scheduler::num_waiting() const { return static_cast<int32_t>(impl_->waiting.size()); }
int32_t Scheduler::num_running() const { return static_cast<int32_t>(impl_->running.size()); }
const KvPagePool& Scheduler::kv_pool() const { return *impl_->kv; }
const StateSlotPool& Scheduler::slot_pool() const { return *impl_->slots; }
const PrefixCache* Scheduler::prefix_cache() const { return impl_->cache.get(); }
const SchedulerConfig& Scheduler::config() const { return impl_->cfg; }
const ParkedSequences& Scheduler::parked() const { return *impl_->parked; }
void Scheduler::drop_parked(uint64_t park_key) {
  impl_->parked->drop(park_key);
  if (impl_->cfg.offload != nullptr) impl_->cfg.offload->drop(park_key);
}

absl::Status Scheduler::invalidate_caches() {
  if (has_unfinished() || !impl_->inflight.empty())
    return absl::FailedPreconditionError(
        absl::StrCat("the scheduler has ", num_waiting() + num_running(), " live requests"));
  if (impl_->cache) impl_->cache->clear();
  impl_->parked->clear();
  if (impl_->cfg.offload != nullptr) impl_->cfg.offload->clear();
  return absl::OkStatus();
}

void Scheduler::for_each_request(const std::function<void(const RequestView&)>& fn) const {
  for (const auto& [id, r] : impl_->reqs) {
    fn(RequestView{r->id, r->running, r->tokens, r->prompt_len, r->num_computed, r->pages,
                   r->slot.id(), r->restore.id(), r->save.id(), r->num_preemptions});
  }
}

}  // namespace loom
