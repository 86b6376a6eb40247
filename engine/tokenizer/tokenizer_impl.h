// Internals of loom::Tokenizer shared by tokenizer.cc (encode/decode) and tokenizer_json.cc
// (loading). Not a public header.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom::tokenizer_internal {

// A PCRE2 pattern compiled with UTF, UCP (Unicode \s \w \d) and MATCH_INVALID_UTF (invalid bytes
// never match but do not stop matching), JIT-compiled when the platform supports it. Immutable;
// find() is thread-safe (match data and JIT stack are per thread).
class Regex {
 public:
  // `literal`: the pattern is a plain string (HuggingFace's {"String": ...} pattern).
  static absl::StatusOr<std::shared_ptr<const Regex>> compile(std::string_view pattern,
                                                              bool literal);
  ~Regex();
  // Finds the leftmost match at or after byte `start`. Returns false when there is none (or when
  // matching fails for resource limits, which then ends the search without crashing).
  bool find(std::string_view subject, size_t start, size_t* begin, size_t* end) const;

  struct Code;  // wraps pcre2_code

 private:
  explicit Regex(Code* code) : code_(code) {}
  Code* code_;  // owned
};

// The GPT-2 split pattern that ByteLevel uses when use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Normalization { kNFC, kNFD, kNFKC, kNFKD };
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;  // Split: its pattern; ByteLevel: GPT-2 pattern or null
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only
};

struct AddedToken {
  std::string content;  // as matched (normalized first when `normalized`)
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Added tokens of one pass (normalized or not), indexed by first byte, longest first.
struct AddedMatcher {
  std::vector<AddedToken> tokens;
  std::array<std::vector<uint32_t>, 256> by_first_byte;
  void build();
  bool empty() const { return tokens.empty(); }
};

// Where special added tokens may be matched: everywhere (`all`), or only wholly inside one of
// `ranges` (sorted, non-overlapping byte ranges of the text being matched).
struct SpecialPolicy {
  bool all = false;
  std::vector<Tokenizer::Range> ranges;
  static SpecialPolicy everywhere() { return {true, {}}; }
  static SpecialPolicy nowhere() { return {false, {}}; }
  bool allows(size_t begin, size_t end) const;
  // End of the stretch of disallowed text that starts at `pos`: the next range's begin (or
  // `limit`). A disallowed match is skipped only up to there, so a straddling lookalike cannot
  // swallow the start of a real marker.
  size_t disallowed_until(size_t pos, size_t limit) const;
  // The policy of text[begin, end), offsets made relative to `begin`.
  SpecialPolicy slice(size_t begin, size_t end) const;
};

struct Merge {
  uint32_t rank;
  int32_t new_id;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// GPT-2's bytes_to_unicode: the printable character standing for each byte.
std::string byte_to_char(uint8_t b);
// Inverse, for one code point; -1 if it stands for no byte.
int byte_of_char(int32_t cp);

}  // namespace loom::tokenizer_internal

namespace loom {

struct Tokenizer::Impl {
  using Regex = tokenizer_internal::Regex;

  // --- Constant after construction. ---
  std::vector<tokenizer_internal::Normalization> normalizers;  // applied in order
  std::vector<tokenizer_internal::PreTokenizerStep> pre_tokenizers;
  // True when a ByteLevel pre-tokenizer maps each byte to its GPT-2 character before BPE.
  bool byte_level_input = false;

  // TikToken format (from_tiktoken): encode cuts Kimi's chunks first, and a piece that is a whole
  // token is that token before any merging (piece_ranks: token bytes -> rank = id).
  bool tiktoken = false;
  absl::flat_hash_map<std::string, int32_t> piece_ranks;

  absl::flat_hash_map<std::string, int32_t> vocab;        // the model's vocabulary (BPE uses it)
  absl::flat_hash_map<std::string, int32_t> added_vocab;  // added tokens (token_id checks first)
  absl::flat_hash_map<uint64_t, tokenizer_internal::Merge> merges;  // pair_key(a, b) -> merge
  std::array<int32_t, 256> byte_ids{};  // byte-level input: id of each byte's character, or -1
  bool all_bytes_in_vocab = false;      // no -1 in byte_ids (set by finish_ids)
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;

  tokenizer_internal::AddedMatcher added_raw;         // normalized == false
  tokenizer_internal::AddedMatcher added_normalized;  // normalized == true

  // Indexed by id, size vocab_size.
  std::vector<std::string> id_to_token;  // spelling ("" for an id nobody names)
  std::vector<std::string> id_bytes;     // what the decoder turns the id into
  std::vector<uint8_t> id_state;         // 0 unknown id, 1 normal, 2 special added token

  // --- Word cache: raw word bytes -> ids. ---
  static constexpr size_t kCacheMaxWords = 1 << 16;  // cleared when full (bounded memory)
  static constexpr size_t kCacheMaxWordBytes = 128;  // longer words are not worth caching
  // std::shared_mutex rather than absl::Mutex: Debian's Abseil runs deadlock detection on every
  // absl::Mutex acquire, which cost ~10% of encode time here.
  mutable std::shared_mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache;  // guarded by cache_mu

  // Fills id_to_token/id_bytes/id_state from vocab and added tokens, and all_bytes_in_vocab.
  // REQUIRES: byte_ids set; every id < size.
  void finish_ids(int32_t size, const std::vector<tokenizer_internal::AddedToken>& all_added);
  // The whole encode: for TikToken, Kimi's chunks each through encode_text; else encode_text.
  void encode_all(std::string_view text, const tokenizer_internal::SpecialPolicy& special,
                  std::vector<int32_t>* out) const;
  void encode_text(std::string_view text, const tokenizer_internal::SpecialPolicy& special,
                   std::vector<int32_t>* out) const;
  void encode_normalized(std::string_view text, const tokenizer_internal::SpecialPolicy& special,
                         std::vector<int32_t>* out) const;
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  void bpe_word(std::string_view word, std::vector<int32_t>* out) const;
  std::string normalize(std::string_view text) const;
};

}  // namespace loom
