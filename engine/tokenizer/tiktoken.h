// TikToken-format tokenizers (internal): Kimi's split pattern, its translation from the Rust regex
// dialect (fancy_regex, what tiktoken runs) to PCRE2, and the chunking of Kimi's encode. The loader
// itself is Tokenizer::from_tiktoken (tiktoken.cc). Not a public header; tests include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom::tokenizer_internal {

// `pat_str` of MoonshotAI's tokenization_kimi.TikTokenTokenizer (Kimi-K2, Kimi-Linear), verbatim.
// Rust regex syntax: `&&` is class intersection, \p{Han} the Han script, \s Unicode White_Space.
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The tokenizer classes (an `auto_map.AutoTokenizer` entry's `module.Class`) whose pattern Loom
// knows, since tokenizer_config.json does not carry it.
inline constexpr std::string_view kKimiTokenizerClass = "tokenization_kimi.TikTokenTokenizer";

// Kimi's special-token layout: ids num_base .. num_base + kKimiSpecialSlots - 1 are special
// (Kimi-Linear's 256 reserved + 2; named by added_tokens_decoder, else <|reserved_token_{id}|>).
inline constexpr int32_t kKimiSpecialSlots = 256 + 2;

// Kimi's TikTokenTokenizer.encode cuts the text into slices of at most kKimiMaxEncodeChars
// characters, then each slice into runs of at most kKimiMaxRunChars consecutive whitespace or
// non-whitespace characters (Python str.isspace), and encodes each piece on its own.
inline constexpr size_t kKimiMaxEncodeChars = 400'000;
inline constexpr size_t kKimiMaxRunChars = 25'000;

// Rewrites a Rust-regex pattern into an equivalent one for Regex::compile (PCRE2 with UTF and
// UCP), for the constructs Kimi's pattern uses and a little more:
//   - \s / \S outside a class, \s inside one: Rust's \s is Unicode White_Space, which PCRE2's
//     UCP \s is not (PCRE2 adds U+180E), so they become explicit White_Space sets;
//   - \p{Han} / \P{Han}: Rust means the Script property, PCRE2 (10.40+) Script_Extensions (which
//     adds CJK punctuation such as U+3001), so they become \p{sc:Han} / \P{sc:Han};
//   - class set operations `[A&&B]` (intersection) and `[A--B]` (difference), B a nested class or
//     plain items, chained left to right: each operand becomes a look-ahead in front of the
//     class, e.g. `[\p{Lu}\p{M}&&[^\p{Han}]]` -> `(?:(?![\p{sc:Han}])[\p{Lu}\p{M}])`.
// Everything else is copied unchanged ((?i:...) case folding, \p{L}, \p{N}, look-ahead, counted
// repetition mean the same in both). Returns InvalidArgument for what it cannot translate
// exactly: \w \W \b \B (different Unicode definitions), \S inside a class, a negated class with a
// set operation, a nested class used as a union, `~~`, an unterminated class.
absl::StatusOr<std::string> translate_rust_pattern(std::string_view pattern);

// Python's str.isspace: Unicode White_Space plus U+001C..U+001F.
bool is_python_space(int32_t cp);

// The pieces [begin, end) that Kimi's encode cuts `text` into (kKimiMaxEncodeChars slices, then
// runs of at most `max_run` characters); consecutive and covering the text. A byte that is not
// valid UTF-8 counts as one non-space character. Appends to `out`.
void kimi_chunks(std::string_view text, size_t max_chars, size_t max_run,
                 std::vector<Tokenizer::Range>* out);

}  // namespace loom::tokenizer_internal
