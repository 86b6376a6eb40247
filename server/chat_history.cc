#include "server/chat_history.h"

#include <utility>

#include "core/status.h"

namespace loom {

std::shared_ptr<const ChatHistory> ChatHistory::append(std::shared_ptr<const ChatHistory> before,
                                                       nlohmann::ordered_json template_messages,
                                                       std::vector<ChatMessage> messages) {
  LOOM_CHECK(template_messages.is_array() && template_messages.size() == messages.size(),
             "ChatHistory::append: %zu template messages for %zu messages",
             template_messages.is_array() ? template_messages.size() : 0, messages.size());
  std::shared_ptr<ChatHistory> h(new ChatHistory());
  h->size_ = (before ? before->size_ : 0) + messages.size();
  h->before_ = std::move(before);
  h->template_messages_ = std::move(template_messages);
  h->messages_ = std::move(messages);
  return h;
}

std::vector<const ChatHistory*> ChatHistory::oldest_first() const {
  std::vector<const ChatHistory*> chain;
  for (const ChatHistory* h = this; h != nullptr; h = h->before_.get()) chain.push_back(h);
  return {chain.rbegin(), chain.rend()};
}

void ChatHistory::append_template_messages(nlohmann::ordered_json* template_messages) const {
  auto& out = template_messages->get_ref<nlohmann::ordered_json::array_t&>();
  out.reserve(out.size() + size_);
  for (const ChatHistory* h : oldest_first())
    out.insert(out.end(), h->template_messages_.begin(), h->template_messages_.end());
}

void ChatHistory::append_messages(std::vector<ChatMessage>* messages) const {
  messages->reserve(messages->size() + size_);
  for (const ChatHistory* h : oldest_first())
    messages->insert(messages->end(), h->messages_.begin(), h->messages_.end());
}

ChatHistory::~ChatHistory() {
  std::shared_ptr<const ChatHistory> next = std::move(before_);
  // A parent only this node holds dies here; take its parent first so its destructor finds none.
  while (next && next.use_count() == 1) {
    std::shared_ptr<const ChatHistory> after = std::move(const_cast<ChatHistory&>(*next).before_);
    next = std::move(after);
  }
}

}  // namespace loom
