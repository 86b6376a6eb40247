// loom-tokenize: encodes or decodes with a tokenizer, one JSON value per line.
//
//   loom-tokenize --tokenizer PATH            stdin: "text" per line   stdout: [ids] per line
//   loom-tokenize --tokenizer PATH --decode   stdin: [ids] per line    stdout: "text" per line
//
// PATH is a tokenizer.json file, a folder (its tokenizer.json, or tiktoken.model with
// tokenizer_config.json: Tokenizer::from_dir), a tiktoken.model file (its folder), or 'byte'.
//
// A line that is not the expected JSON prints an error on stderr and the tool exits with 1.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "",
          "a HuggingFace tokenizer.json, a model folder (tokenizer.json, or tiktoken.model with "
          "tokenizer_config.json), a tiktoken.model file, or 'byte' for the plain byte-level "
          "tokenizer");
ABSL_FLAG(bool, decode, false, "read JSON arrays of ids and print JSON strings");
ABSL_FLAG(bool, skip_special, false, "with --decode, leave special tokens out");
ABSL_FLAG(bool, no_special, false, "encode special-token text as ordinary text");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-tokenize --tokenizer PATH [--decode] < lines");
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) {
    std::fprintf(stderr, "loom-tokenize: --tokenizer is required\n");
    return 2;
  }
  std::unique_ptr<loom::Tokenizer> tokenizer;
  if (path == "byte") {
    tokenizer = loom::Tokenizer::byte_level();
  } else {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto loaded = fs::is_directory(path, ec) ? loom::Tokenizer::from_dir(path)
                  : fs::path(path).filename() == "tiktoken.model"
                      ? loom::Tokenizer::from_dir(fs::path(path).parent_path().string())
                      : loom::Tokenizer::from_file(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "loom-tokenize: %s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    tokenizer = *std::move(loaded);
  }
  const bool decode = absl::GetFlag(FLAGS_decode);
  std::string line;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    const auto value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (decode) {
      std::vector<int32_t> ids;
      bool ok = value.is_array();
      for (size_t i = 0; ok && i < value.size(); ++i) {
        ok = value[i].is_number_integer() && value[i].get<int64_t>() >= INT32_MIN &&
             value[i].get<int64_t>() <= INT32_MAX;
        if (ok) ids.push_back(static_cast<int32_t>(value[i].get<int64_t>()));
      }
      if (!ok) {
        std::fprintf(stderr, "loom-tokenize: line %zu: expected a JSON array of ids\n", line_no);
        return 1;
      }
      auto text = tokenizer->decode(ids, absl::GetFlag(FLAGS_skip_special));
      if (!text.ok()) {
        std::fprintf(stderr, "loom-tokenize: line %zu: %s\n", line_no,
                     std::string(text.status().message()).c_str());
        return 1;
      }
      std::cout << nlohmann::json(*text).dump() << '\n';
    } else {
      if (!value.is_string()) {
        std::fprintf(stderr, "loom-tokenize: line %zu: expected a JSON string\n", line_no);
        return 1;
      }
      const auto ids =
          tokenizer->encode(value.get_ref<const std::string&>(), !absl::GetFlag(FLAGS_no_special));
      std::cout << nlohmann::json(ids).dump() << '\n';
    }
  }
  return 0;
}
