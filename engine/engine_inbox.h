// EngineInbox: the one place the engine's threads meet. Any thread queues requests and
// cancellations and reads the stats snapshot; the loop thread takes what was queued and publishes
// the snapshot. Everything here is guarded by one mutex, which the loop thread never holds while
// it runs a step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "engine/request_stream.h"

namespace loom {

class EngineInbox {
 public:
  // Request ids first_id, first_id + id_stride, ...: an expert-parallel engine gives rank r of N
  // the ids r + 1 + k N, so that an id alone names the rank that runs it.
  explicit EngineInbox(uint64_t first_id = 1, uint64_t id_stride = 1)
      : next_id_(first_id), id_stride_(id_stride) {}

  struct Pending {
    uint64_t id;
    Request request;
    std::shared_ptr<RequestStream> stream;
    uint64_t session = 0;   // the session's key (SessionStore) for a session turn, else 0
    int64_t continued = 0;  // a session turn: the history tokens it continues
  };
  // A weight update for the loop thread to apply between steps (Engine::update_weights). The
  // caller owns it and waits on `done`; the loop fills `result` and `version`, then notifies.
  struct WeightUpdate {
    absl::AnyInvocable<void()> copy;  // writes the new values into the model's parameters
    absl::Status result;
    int64_t version = 0;  // the weight version from then on
    absl::Notification done;
  };
  // Everything queued since the loop's previous take().
  struct Intake {
    std::vector<Pending> arrivals;              // in submission order
    std::vector<uint64_t> cancels;              // request ids, in cancel() order
    std::vector<uint64_t> dropped_sessions;     // keys of deleted sessions
    std::vector<WeightUpdate*> weight_updates;  // in update_weights() order
    bool stopping = false;                      // stop() was called: cancel everything and return
  };

  // Any thread. Queues `request` (already validated) under a new id and returns its stream;
  // FailedPrecondition once stop() was called. A session turn: the session's key and the history
  // tokens it continues (SessionStore::Turn).
  absl::StatusOr<std::shared_ptr<RequestStream>> push(Request request, uint64_t session = 0,
                                                      int64_t continued = 0);
  void cancel(uint64_t request_id);
  // Any thread: the session with this key was deleted; the loop drops the cache it kept.
  void drop_session(uint64_t key);
  // Any thread: queues `update` (which must outlive its `done`) for the loop. After stop() it is
  // refused at once (FailedPrecondition in its result, `done` notified).
  void push_weight_update(WeightUpdate* update);
  // Any thread: from now on push() fails and the loop's next take() says stopping. Idempotent.
  void stop();
  // The loop thread of a rank whose group failed (expert parallelism): from now on push() fails
  // with `why`, and take() says stopping.
  void fail(const absl::Status& why);
  // Any thread: the loop's next take() returns at once even with nothing queued (an expert-parallel
  // rank must join a step another rank's arrivals start).
  void wake();
  // Tokens queued plus running on this engine (prompt tokens of every live choice and the tokens
  // each has generated): what an expert-parallel engine spreads new requests by. push() adds a
  // request's prompt for each choice; the loop adds generated tokens and retires a finished
  // choice's (add_load). Any thread reads it.
  int64_t load_tokens() const { return load_tokens_.load(std::memory_order_relaxed); }
  void add_load(int64_t tokens) { load_tokens_.fetch_add(tokens, std::memory_order_relaxed); }
  // Any thread: waits until every pushed request's stream was closed and published as such.
  void wait_idle();
  // Any thread: the snapshot of the last publish().
  EngineStats stats() const;

  // The loop thread: waits for something to do (at once when `busy`: the scheduler still has
  // requests) or for `deadline` (a session's expiry), then takes everything queued.
  Intake take(bool busy, absl::Time deadline = absl::InfiniteFuture());
  // The loop thread: publishes `stats` and retires `closed` streams (closed since the previous
  // publish) from the live count together, so wait_idle() returns with final pool counts.
  void publish(const EngineStats& stats, int64_t closed);

 private:
  mutable absl::Mutex mu_;
  std::vector<Pending> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> dropped_sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<WeightUpdate*> weight_updates_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // pushed and not yet retired by publish()
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  const uint64_t id_stride_;
  std::atomic<int64_t> load_tokens_{0};
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom
