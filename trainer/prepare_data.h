// Text files to a token shard (trainer/token_shard.h): what `loom-trainer prepare-data` runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

enum class DocumentSplit : uint8_t {
  kFile,       // each input file is one document
  kParagraph,  // each run of non-blank lines is one document (blank lines separate them)
};

struct PrepareDataStats {
  int64_t files = 0, documents = 0, tokens = 0, bytes = 0;
};

// Tokenizes every input (special-token spellings in the text stay ordinary text) and writes one
// shard to `out`, atomically. Documents with no tokens are skipped. NotFound / InvalidArgument
// name the input at fault; nothing is written then.
absl::StatusOr<PrepareDataStats> prepare_token_shard(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& inputs,
                                                     DocumentSplit split, const std::string& out);

}  // namespace loom
