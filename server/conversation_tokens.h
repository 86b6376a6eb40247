// ConversationTokens: the token ids a kept conversation's model saw and the text they spell, so
// that its next turn tokenizes only what is new (issue 18: no re-tokenization of the history).
//
// A turn's prompt is the chat template's rendering of the whole conversation (rendering is cheap:
// docs/api.md "Sessions" has the measurement). When the text kept at the end of the previous
// turn (that turn's prompt text and its reply as decoded, special tokens spelled out) is a prefix
// of the new rendering, the prompt is the kept ids followed by the encoding of the rest of the
// text alone, which starts at a special token the template placed (split_conversation below says
// why encoding from there equals encoding the whole). The kept ids are what the model saw,
// including the reply's ids as sampled, so a reply whose text would re-encode differently still
// continues. Otherwise (the template renders history differently, e.g. without reasoning; a stop
// string ended the reply) the caller encodes the whole rendering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace loom {

struct ConversationTokens {
  std::string text;             // what `tokens` spell (Tokenizer::decode, specials included)
  std::vector<int32_t> tokens;  // the ids the model saw: prompts and replies as sampled
};

// Encodes a rendered prompt from byte `begin` on (encode_chat_text, server/openai_request.h).
using EncodeFrom = std::function<std::vector<int32_t>(size_t begin)>;

// The next prompt of `kept`'s conversation, whose whole rendering is `rendered`; nullopt when it
// cannot continue `kept` (the caller then encodes all of `rendered`). `special_at(b, e)`: whether
// the encoding matches a special token at bytes [b, e) of `rendered` (inside the template's
// markup). `encoded_bytes` (optional): set to how many bytes `encode` was given.
//
// The rest is encoded from a special token S the template placed at the seam: the kept ids'
// last one when it is special and its spelling ends the kept text (a reply that stopped at its
// end-of-turn token), else the first token of the new text when that is special (a reply cut by
// max_tokens, followed by the template's end-of-turn marker). The encoding restarts at every
// special-token match (Tokenizer: added tokens are split off before normalization and
// pre-tokenization), and it is given S itself first, so S's own strip flags and the context a
// following added token's single_word or lstrip rule reads are the same as in the whole text;
// the result must begin with S (it does not when a longer added token starts there: nullopt).
// So whenever the whole rendering's encoding begins with `kept.tokens`, the result equals it.
// (One exception, documented in docs/api.md: a TikToken tokenizer cuts texts of more than
// 400,000 characters and runs of more than 25,000 spaces or non-spaces into pieces counted from
// the start of the text, which the seam moves.)
std::optional<std::vector<int32_t>> split_conversation(
    const ConversationTokens& kept, std::string_view rendered, const Tokenizer& tokenizer,
    const std::function<bool(size_t, size_t)>& special_at, const EncodeFrom& encode,
    size_t* encoded_bytes = nullptr);

// `prompt` (its text and ids) followed by the reply `reply_ids` as sampled, the stop token
// included. An id the tokenizer cannot spell is kept among the ids and adds no text, as the
// streamed text shows it (engine/choice_text.h). nullopt when decoding fails.
std::optional<ConversationTokens> conversation_after_reply(const ConversationTokens& prompt,
                                                           std::span<const int32_t> reply_ids,
                                                           const Tokenizer& tokenizer);

}  // namespace loom
