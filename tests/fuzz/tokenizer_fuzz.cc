// libFuzzer target for engine/tokenizer. The first input byte picks what the rest feeds:
//   0: text to encode with the Qwen-style fixture tokenizer (loaded once), with and without
//      special tokens; the ids must decode, stream-decode identically, and spell the input bytes;
//   1: little-endian int32 ids to decode and stream-decode (unknown ids must be errors);
//   2: a whole tokenizer.json to parse (an accepted one must then encode and decode its input);
//   3: text through the plain byte-level tokenizer.
// Nothing may crash, trip a sanitizer, or emit invalid UTF-8 from decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace {

const loom::Tokenizer& qwen() {
  static const loom::Tokenizer* tokenizer = [] {
    auto loaded = loom::Tokenizer::from_file(LOOM_FIXTURES_DIR "/tokenizer_qwen/tokenizer.json");
    if (!loaded.ok()) std::abort();
    return loaded->release();
  }();
  return *tokenizer;
}

const loom::Tokenizer& bytes_tokenizer() {
  static const loom::Tokenizer* tokenizer = loom::Tokenizer::byte_level().release();
  return *tokenizer;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || b == 0xC0 || b == 0xC1 || b > 0xF4 || i + len > s.size()) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

void check_decode(const loom::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (bool skip : {false, true}) {
    auto text = tokenizer.decode(ids, skip);
    loom::StreamingDetokenizer stream(tokenizer, skip);
    std::string streamed;
    bool ok = true;
    for (int32_t id : ids) {
      auto delta = stream.push(id);
      if (!delta.ok()) {
        ok = false;
        continue;  // an unknown id is skipped by the stream, as the caller would
      }
      if (!valid_utf8(*delta)) std::abort();
      streamed += *delta;
    }
    streamed += stream.finish();
    if (ok != text.ok()) std::abort();
    if (text.ok() && (*text != streamed || !valid_utf8(*text))) std::abort();
  }
}

void check_encode(const loom::Tokenizer& tokenizer, std::string_view text) {
  for (bool allow_special : {true, false}) {
    const std::vector<int32_t> ids = tokenizer.encode(text, allow_special);
    std::string bytes;
    for (int32_t id : ids) {
      auto token = tokenizer.token_bytes(id);
      if (!token) std::abort();
      bytes += *token;
    }
    // Without a normalizer, byte-level BPE spells its input exactly.
    if (bytes != text) std::abort();
    check_decode(tokenizer, ids);
    // Special tokens limited to ranges: no ranges is allow_special = false, one range over
    // everything is allow_special = true.
    const std::vector<loom::Tokenizer::Range> all = {{0, text.size()}};
    if (tokenizer.encode_with_special_ranges(
            text, allow_special ? all : std::vector<loom::Tokenizer::Range>{}) != ids) {
      std::abort();
    }
  }
  // Ranges toggled at each '\n' (a chat prompt's markup and content alternate): still an exact
  // spelling of the input.
  std::vector<loom::Tokenizer::Range> ranges;
  size_t begin = 0;
  bool markup = true;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '\n') continue;
    if (markup && i > begin) ranges.push_back({begin, i});
    markup = !markup;
    begin = i;
  }
  const std::vector<int32_t> ids = tokenizer.encode_with_special_ranges(text, ranges);
  std::string bytes;
  for (int32_t id : ids) bytes += *tokenizer.token_bytes(id);
  if (bytes != text) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_encode(qwen(), rest);
      break;
    case 1: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      for (int32_t& id : ids) id = id % 4 == 0 ? id : (id & 0x7FF);  // mostly valid ids
      check_decode(qwen(), ids);
      break;
    }
    case 2: {
      auto tokenizer = loom::Tokenizer::from_json(rest);
      if (tokenizer.ok()) {
        const auto ids = (*tokenizer)->encode(rest.substr(0, 256));
        check_decode(**tokenizer, ids);
      }
      break;
    }
    case 3:
      check_encode(bytes_tokenizer(), rest);
      break;
  }
  return 0;
}
