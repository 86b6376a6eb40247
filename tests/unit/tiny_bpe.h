// Tiny hand-written byte-level BPE tokenizer.json files for tests.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace loom::testing {

// GPT-2's byte-to-character map: the character that spells byte `b` in a byte-level vocabulary.
inline std::string byte_char(int b) {
  auto printable = [](int c) {
    return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
  };
  int n = 0;
  for (int c = 0; c < b; ++c) n += !printable(c);
  const int cp = printable(b) ? b : 256 + n;
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A tokenizer.json: ids 0..255 are the bytes, then one id per merge (in order), then `added`
// (their ids are assigned here).
inline nlohmann::json tiny_tokenizer(const nlohmann::json& merges, nlohmann::json added,
                                     const nlohmann::json& normalizer) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = next++;
  for (const auto& m : merges) vocab[m[0].get<std::string>() + m[1].get<std::string>()] = next++;
  for (auto& token : added) token["id"] = next++;
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

}  // namespace loom::testing
