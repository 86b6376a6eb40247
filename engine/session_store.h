// SessionStore: the conversations the engine keeps between turns (Request::session), as token
// histories. A turn sends only its new tokens; submit() appends them to the history and the loop
// continues the sequence the scheduler parked at the end of the previous turn (ParkedSequences),
// or recomputes from the history when that was evicted.
//
// A session's history after a turn is every token of the turn's sequence: the previous history,
// the turn's new tokens and every token the turn generated, including the one that stopped it (an
// EOS or stop token, or the tokens of a matched stop string, which the text output withholds).
// That last token was sampled but never fed to the model; the next turn feeds it first. A turn
// that is cancelled or fails leaves the history as it was before the turn.
//
// Thread-safety: all methods are thread-safe (one mutex). submit() starts turns on any thread;
// the loop thread ends them and expires idle sessions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom {

class SessionStore {
 public:
  // At most `max_sessions` live sessions; one idle for `ttl` is dropped.
  SessionStore(int32_t max_sessions, absl::Duration ttl) : max_sessions_(max_sessions), ttl_(ttl) {}

  struct Turn {
    uint64_t key = 0;             // the session's key (unique for the engine's life)
    std::vector<int32_t> prompt;  // the history followed by the new tokens
    int64_t continued = 0;        // history tokens the turn continues from (0: a fresh start)
    uint64_t dropped = 0;         // the key of a session replaced by a whole-prompt turn, or 0
  };
  // Starts a turn of session `name`, creating the session when there is none. FailedPrecondition
  // while the session's previous turn is still running; ResourceExhausted for a new session when
  // max_sessions are live.
  // `whole` (Request::session_whole_prompt): `new_tokens` is the whole conversation; a session
  // whose history is not a proper prefix of it is replaced by a new one (Turn::dropped).
  absl::StatusOr<Turn> begin_turn(const std::string& name, std::span<const int32_t> new_tokens,
                                  absl::Time now, bool whole = false);
  // Undoes begin_turn for a turn that was never queued (a refused request): a session it created
  // is removed, an existing one is idle again.
  void abort_turn(uint64_t key);
  // The loop thread: the turn of session `key` ended. `history`: the sequence's tokens (a turn that
  // stopped or reached its length); nullopt: cancelled or failed, the history stays. False when the
  // session is gone (deleted meanwhile): the caller drops what it kept for it.
  bool end_turn(uint64_t key, std::optional<std::vector<int32_t>> history, absl::Time now);
  // Deletes session `name` (NotFound if there is none) and returns its key. A turn still running
  // completes, but its end state is not kept.
  absl::StatusOr<uint64_t> erase(const std::string& name);
  // Whether session `name` is live (an expert-parallel engine keeps a session on one rank).
  bool contains(const std::string& name) const;
  // Removes the sessions idle for the ttl at `now`; returns their keys.
  std::vector<uint64_t> expire(absl::Time now);
  // When the next idle session expires (InfiniteFuture when none is idle).
  absl::Time next_expiry() const;

  struct Stats {
    int32_t sessions = 0;
    int64_t history_tokens = 0;
    int64_t expired = 0;  // by the ttl, since start
  };
  Stats stats() const;

 private:
  struct Session {
    std::string name;
    std::vector<int32_t> history;
    bool busy = false;             // a turn is queued or running
    bool created_by_turn = false;  // created by the running turn (abort_turn removes it)
    absl::Time last_used;
  };
  void remove(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t max_sessions_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_name_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t history_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace loom
