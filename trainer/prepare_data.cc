#include "trainer/prepare_data.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "trainer/token_shard.h"

namespace loom {
namespace {

// Splits on blank lines (lines holding only spaces, tabs or '\r'); keeps each paragraph's own
// newlines except the last.
std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::string current;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
      continue;
    }
    if (!current.empty()) current.push_back('\n');
    current += line;
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

}  // namespace

absl::StatusOr<PrepareDataStats> prepare_token_shard(const Tokenizer& tokenizer,
                                                     const std::vector<std::string>& inputs,
                                                     DocumentSplit split, const std::string& out) {
  if (inputs.empty()) return absl::InvalidArgumentError("prepare-data: no input files");
  PrepareDataStats stats;
  TokenShardWriter writer;
  for (const std::string& path : inputs) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return absl::NotFoundError(absl::StrCat("prepare-data: cannot read ", path));
    std::ostringstream text;
    text << f.rdbuf();
    const std::string all = text.str();
    ++stats.files;
    stats.bytes += static_cast<int64_t>(all.size());
    const std::vector<std::string> docs =
        split == DocumentSplit::kFile ? std::vector<std::string>{all} : paragraphs(all);
    for (const std::string& doc : docs) {
      const std::vector<int32_t> ids = tokenizer.encode(doc, /*allow_special=*/false);
      if (ids.empty()) continue;
      LOOM_RETURN_IF_ERROR(writer.add_document(ids));
      ++stats.documents;
      stats.tokens += static_cast<int64_t>(ids.size());
    }
  }
  LOOM_RETURN_IF_ERROR(writer.write(out));
  return stats;
}

}  // namespace loom
