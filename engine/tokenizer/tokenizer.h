// Text <-> token ids for Loom: HuggingFace `tokenizer.json` byte-level BPE (GPT-2 / Qwen2 style),
// TikToken-format folders (tiktoken.model + tokenizer_config.json, Kimi's) and a plain byte-level
// tokenizer for small bundled models, behind one class. See docs/tokenizer.md for what of each
// format is supported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom {

// Immutable after construction. Every const method is safe to call from many threads at once
// (encoding keeps per-call scratch; its word cache is internally synchronized).
class Tokenizer {
 public:
  // Loads a HuggingFace tokenizer.json. Returns InvalidArgument naming the offending field for a
  // malformed or unsupported file (bad JSON, missing model/vocab/merges, a merge naming an unknown
  // token, ids out of range, an unsupported normalizer/pre_tokenizer/decoder type), NotFound if
  // the file cannot be read.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> from_file(const std::string& path);
  // Same, from the file's text.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> from_json(std::string_view json_text);

  // Loads a TikToken-format tokenizer as MoonshotAI's tokenization_kimi.TikTokenTokenizer builds
  // it: `model_text` is tiktoken.model (one "base64(token bytes) rank" per line; the ranks are the
  // ids 0..n-1), `config_json` is tokenizer_config.json (its auto_map must name that class, whose
  // split pattern Loom knows; added_tokens_decoder names the special ids n..n+257, the others are
  // <|reserved_token_{id}|>). Encoding follows its encode(): runs of at most 25,000 whitespace or
  // non-whitespace characters, special tokens, the split pattern, tiktoken's rank-ordered merges.
  // InvalidArgument naming the file and line or field for a malformed or unsupported file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> from_tiktoken(std::string_view model_text,
                                                                  std::string_view config_json);
  // Loads the tokenizer of a model folder, the format chosen by the files present:
  // tokenizer.json (as from_file) if there is one, else tiktoken.model with tokenizer_config.json
  // (as from_tiktoken; errors name the file's path). NotFound if the folder has neither file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> from_dir(const std::string& dir);
  // The file from_dir loads in `dir`: "tokenizer.json", "tiktoken.model", or "" for neither.
  static std::string format_in_dir(const std::string& dir);

  // Plain byte-level tokenizer: id b (0..255) is byte b, then the special tokens
  // <|endoftext|> = 256, <|im_start|> = 257, <|im_end|> = 258, <|tool_call|> = 259.
  static std::unique_ptr<Tokenizer> byte_level();

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes `text`. Added tokens are matched as whole tokens first (honouring their single_word,
  // lstrip, rstrip and normalized flags); with `allow_special` false, tokens flagged special are
  // not matched and are encoded as ordinary text. Never fails: bytes that are not valid UTF-8 are
  // kept (byte-level BPE can spell any byte); a model without byte coverage drops or maps to unk
  // what it cannot spell, as HuggingFace does.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;

  // A byte range [begin, end) of a text.
  struct Range {
    size_t begin = 0, end = 0;
  };
  // Encodes `text` as encode() does, except that special tokens are matched only where they lie
  // wholly inside one of `special_ranges` (sorted, non-overlapping); elsewhere their spelling is
  // ordinary text. Everything else (non-special added tokens, normalization, pre-tokenization,
  // merges) runs over the whole text, so the ids equal encode(text) whenever no special-token
  // spelling occurs outside the ranges. This is how a chat prompt is encoded: the template's own
  // markers are the ranges, and text a client sent cannot forge them. With a normalizer, a stretch
  // that crosses a range boundary is normalized piecewise (differs from the whole only when a
  // combining sequence straddles the boundary).
  std::vector<int32_t> encode_with_special_ranges(std::string_view text,
                                                  std::span<const Range> special_ranges) const;

  // Decodes ids to text, as HuggingFace's decode with the ByteLevel decoder (or tiktoken's decode):
  // token bytes are concatenated and invalid UTF-8 becomes U+FFFD (one per maximal invalid
  // subsequence).
  // With `skip_special`, special added tokens are left out. Returns InvalidArgument for an id
  // outside the vocabulary.
  absl::StatusOr<std::string> decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;
  // Id of a token by its vocabulary spelling (e.g. "<|im_end|>", "Ġthe"); nullopt if unknown.
  std::optional<int32_t> token_id(std::string_view token) const;
  // Whether `id` is an added token flagged special (false for unknown ids).
  bool is_special(int32_t id) const;
  // The raw bytes `id` decodes to (before UTF-8 repair); nullopt for an unknown id.
  std::optional<std::string_view> token_bytes(int32_t id) const;

  struct Impl;  // defined in tokenizer_impl.h; public only so the loader's helpers can fill it

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns ids arriving one at a time into text deltas. No delta contains a partial UTF-8 sequence:
// incomplete trailing bytes are held back until they complete, and invalid bytes become U+FFFD
// only once no continuation could make them valid. The concatenation of all push() results and
// finish() equals Tokenizer::decode of the same ids. Not thread-safe (one per stream); the
// tokenizer must outlive it.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // Appends one id and returns the newly completed text (often empty). InvalidArgument for an
  // unknown id; the stream is then unchanged.
  absl::StatusOr<std::string> push(int32_t id);
  // Ends the stream: returns the held-back bytes, as U+FFFD if any. The detokenizer is then empty
  // and may be reused for a new stream.
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most a 3-byte incomplete UTF-8 prefix
};

}  // namespace loom
