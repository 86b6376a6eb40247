// Token shards: the trainer's pre-tokenized data, one file per shard, little-endian:
//
//   offset 0   magic "LOOMTOKS" (8 bytes)
//   8          u32 version (1)
//   12         u32 token width in bytes (2 when every id < 65536, else 4)
//   16         u64 num_docs
//   24         u64 num_tokens
//   32         u64 doc_offsets[num_docs + 1]   0 first, num_tokens last, non-decreasing
//   ...        tokens[num_tokens]               u16 or u32
//
// Documents are stored back to back with no separator; samplers put EOS between them. The file
// size must be exactly what the header implies, so a truncated or padded shard is rejected.
// docs/trainer.md describes the format and `loom-trainer prepare-data`, which writes it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"

namespace loom {

inline constexpr char kTokenShardMagic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 32;

class TokenShard {
 public:
  // Maps and validates a shard. InvalidArgument naming the file and the field at fault.
  static absl::StatusOr<TokenShard> open(const std::string& path);
  static absl::StatusOr<TokenShard> parse(MappedFile file);

  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }
  // Document d is tokens [doc_begin(d), doc_begin(d + 1)).
  int64_t doc_begin(int64_t d) const;
  int32_t token(int64_t i) const;
  // Copies tokens [begin, begin + out.size()) (which must lie inside the shard).
  void read(int64_t begin, std::span<int32_t> out) const;
  // The largest token id in the shard (checked against a model's vocabulary before training).
  int32_t max_token() const { return max_token_; }

 private:
  MappedFile file_;
  int64_t num_docs_ = 0, num_tokens_ = 0;
  int token_bytes_ = 0;
  int32_t max_token_ = -1;
  const char* offsets_ = nullptr;  // u64 [num_docs + 1], unaligned reads
  const char* tokens_ = nullptr;
};

// Collects documents and writes one shard, atomically (a temporary file renamed over `path`), so
// a crash never leaves a half-written shard under the final name.
class TokenShardWriter {
 public:
  // InvalidArgument for a negative id.
  absl::Status add_document(std::span<const int32_t> ids);
  int64_t num_docs() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  absl::Status write(const std::string& path) const;
  // The shard's bytes (what write() puts in the file).
  std::string serialize() const;

 private:
  std::vector<uint64_t> offsets_ = {0};
  std::vector<int32_t> tokens_;
};

}  // namespace loom
