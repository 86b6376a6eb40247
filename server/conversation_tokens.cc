#include "server/conversation_tokens.h"

#include <utility>

#include "absl/status/statusor.h"

namespace loom {

std::optional<std::vector<int32_t>> split_conversation(
    const ConversationTokens& kept, std::string_view rendered, const Tokenizer& tokenizer,
    const std::function<bool(size_t, size_t)>& special_at, const EncodeFrom& encode,
    size_t* encoded_bytes) {
  if (encoded_bytes != nullptr) *encoded_bytes = 0;
  const size_t seam = kept.text.size();
  if (kept.tokens.empty() || rendered.size() <= seam || !rendered.starts_with(kept.text))
    return std::nullopt;
  // Where the encoding restarts: at S, the special token on either side of the seam.
  size_t begin = seam;
  bool kept_ends_with_s = false;
  const int32_t last = kept.tokens.back();
  if (tokenizer.is_special(last)) {
    const std::optional<std::string_view> s = tokenizer.token_bytes(last);
    if (s && !s->empty() && std::string_view(kept.text).ends_with(*s) &&
        special_at(seam - s->size(), seam)) {
      begin = seam - s->size();
      kept_ends_with_s = true;
    }
  }
  std::vector<int32_t> rest = encode(begin);
  if (encoded_bytes != nullptr) *encoded_bytes = rendered.size() - begin;
  if (rest.empty()) return std::nullopt;
  if (kept_ends_with_s) {
    if (rest.front() != last) return std::nullopt;  // a longer added token starts at S
    rest.erase(rest.begin());
  } else {
    // The new text must open with a special token the template placed, matched as exactly its
    // spelling (no strip flag reaching back over the seam shows here: it would eat only text
    // after it).
    const int32_t first = rest.front();
    const std::optional<std::string_view> s = tokenizer.token_bytes(first);
    if (!tokenizer.is_special(first) || !s || s->empty() ||
        !rendered.substr(seam).starts_with(*s) || !special_at(seam, seam + s->size()))
      return std::nullopt;
  }
  std::vector<int32_t> prompt;
  prompt.reserve(kept.tokens.size() + rest.size());
  prompt = kept.tokens;
  prompt.insert(prompt.end(), rest.begin(), rest.end());
  return prompt;
}

std::optional<ConversationTokens> conversation_after_reply(const ConversationTokens& prompt,
                                                           std::span<const int32_t> reply_ids,
                                                           const Tokenizer& tokenizer) {
  // The reply's text as the stream showed it (ChoiceText): an id the tokenizer cannot spell (a
  // model vocabulary padded past the tokenizer's) adds no text, and its neighbours' bytes join.
  std::vector<int32_t> spelled;
  spelled.reserve(reply_ids.size());
  for (const int32_t id : reply_ids)
    if (tokenizer.token_bytes(id).has_value()) spelled.push_back(id);
  absl::StatusOr<std::string> reply = tokenizer.decode(spelled);
  if (!reply.ok()) return std::nullopt;
  ConversationTokens out;
  out.text.reserve(prompt.text.size() + reply->size());
  out.text = prompt.text;
  out.text += *reply;
  out.tokens.reserve(prompt.tokens.size() + reply_ids.size());
  out.tokens = prompt.tokens;
  out.tokens.insert(out.tokens.end(), reply_ids.begin(), reply_ids.end());
  return out;
}

}  // namespace loom
