// UTF-8 helpers for the tokenizer (internal): lossy repair with the "maximal subpart" rule that
// Rust's String::from_utf8_lossy and HuggingFace decoding use, and small code point queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::tokenizer_internal {

// Appends `bytes` to `out` with each maximal invalid subsequence replaced by U+FFFD. With
// `final` false, a trailing incomplete-but-still-valid prefix of a sequence is not consumed.
// Returns the number of bytes of `bytes` consumed (== bytes.size() when `final`).
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string* out);

// Whether `s` is entirely valid UTF-8.
bool is_valid_utf8(std::string_view s);

// Length of the character starting at s[i]: the full sequence length when it is valid and
// complete, else 1 (an invalid byte counts as one character). REQUIRES: i < s.size().
size_t utf8_char_len(std::string_view s, size_t i);

// Decodes the valid character at s[i] (per utf8_char_len); invalid bytes give -1.
int32_t utf8_decode_at(std::string_view s, size_t i, size_t* len);

// Start of the character ending just before `end` (steps back over continuation bytes, at most 3).
size_t utf8_prev_start(std::string_view s, size_t end);

// Unicode White_Space (Rust's char::is_whitespace).
bool is_white_space(int32_t cp);

// Rust regex's Unicode \w (what HuggingFace's single_word test uses): letters, marks, decimal and
// letter numbers, connector punctuation (incl. '_'), ZWNJ and ZWJ. Alphabetic is approximated by
// the L* categories plus Nl.
bool is_word_char(int32_t cp);

void append_utf8(int32_t cp, std::string* out);

}  // namespace loom::tokenizer_internal
