// ChatHistory: a kept conversation's messages as the chat parser left them, so that a session's
// next turn (server/chat_session.h) neither re-serializes nor re-parses its history (issue 18: at
// a 64K-token history that was 1-2.5 ms per turn, more than rendering and tokenizing the turn).
//
// Every message enters once, already checked: a turn's new messages as parse_chat_request read
// them, a reply as parse_chat_message reads it (server/openai_request.h). Nothing the client sends
// skips a check: a session's client sends only new messages, and the history is the server's own.
//
// Immutable and shared: a turn's history is its parent's followed by the turn's messages, so the
// many stored responses of one conversation (ResponseStore keeps each) share their common past
// instead of each holding a copy of it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace loom {

class ChatHistory {
 public:
  // `before` (null: none) followed by `template_messages` (a JSON array of message objects as the
  // client wrote them: what a checkpoint's own template reads) and `messages` (the same messages
  // converted: what the built-in templates read). REQUIRES: equal lengths.
  static std::shared_ptr<const ChatHistory> append(std::shared_ptr<const ChatHistory> before,
                                                   nlohmann::ordered_json template_messages,
                                                   std::vector<ChatMessage> messages);

  size_t size() const { return size_; }
  // Append the whole conversation, oldest first, to `template_messages` (an array) or `messages`.
  void append_template_messages(nlohmann::ordered_json* template_messages) const;
  void append_messages(std::vector<ChatMessage>* messages) const;

  ChatHistory(const ChatHistory&) = delete;
  ChatHistory& operator=(const ChatHistory&) = delete;
  // Frees the chain of parents this node alone holds iteratively: a conversation of thousands of
  // turns would otherwise recurse once per turn.
  ~ChatHistory();

 private:
  ChatHistory() = default;
  std::vector<const ChatHistory*> oldest_first() const;

  std::shared_ptr<const ChatHistory> before_;
  nlohmann::ordered_json template_messages_;
  std::vector<ChatMessage> messages_;
  size_t size_ = 0;  // before_'s and these
};

}  // namespace loom
