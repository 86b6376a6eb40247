// ResponseStore: the responses POST /v1/responses stored (store: true), for GET, DELETE and
// previous_response_id. Each keeps the conversation up to and including its reply, as chat
// messages, and the engine session (Request::session) that holds its conversation's tokens and
// cache. Turns of one conversation share a session; a response continued twice (a fork) still
// answers right, because each entry keeps its own conversation's ids and the engine checks the
// session's token history against the turn's prompt before continuing it (server/chat_session.h).
//
// Bounded: at most `max_entries` (the oldest dropped first) and none older than `ttl` (the
// engine's session ttl, so a stored response outlives neither its session's kept cache nor the
// time a client was told it has). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "server/chat_history.h"
#include "server/conversation_tokens.h"

namespace loom {

class ResponseStore {
 public:
  ResponseStore(int64_t max_entries, absl::Duration ttl) : max_entries_(max_entries), ttl_(ttl) {}

  struct Entry {
    std::string session;  // the engine session of its conversation
    // The conversation's messages (chat shape) up to and including this response's reply,
    // without any instructions, as parsed when each came in (shared with the conversation's
    // other responses).
    std::shared_ptr<const ChatHistory> messages;
    std::string response_json;  // the response object, as GET returns it
    // The ids the model saw for `messages` and their text, so that the next turn encodes only
    // its new text (server/conversation_tokens.h); null: the next turn encodes it all.
    std::shared_ptr<const ConversationTokens> tokens;
  };
  void put(const std::string& id, Entry entry, absl::Time now);
  // NotFound-style: nullopt when unknown or expired.
  std::optional<Entry> get(const std::string& id, absl::Time now);
  // Whether it was there. `*session_latest` (when given) is set to whether no later response
  // of its session was stored: its session then holds this response's conversation.
  bool erase(const std::string& id, absl::Time now, std::string* session, bool* session_latest);
  int64_t size() const;

 private:
  struct Stored {
    Entry entry;
    absl::Time created;
    uint64_t serial = 0;
  };
  void expire(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_entries_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Stored> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, uint64_t>> order_ ABSL_GUARDED_BY(mu_);  // (id, serial)
  absl::flat_hash_map<std::string, uint64_t> latest_ ABSL_GUARDED_BY(mu_);   // session -> serial
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace loom
