// libFuzzer target for engine/tokenizer. The first input byte picks what the rest feeds:
//   0: text to encode with the Qwen-style fixture tokenizer (loaded once), with and without
//      special tokens; the ids must decode, stream-decode identically, and spell the input bytes;
//   1: little-endian int32 ids to decode and stream-decode (unknown ids must be errors);
//   2: a whole tokenizer.json to parse (an accepted one must then encode and decode its input);
//   3: text through the plain byte-level tokenizer;
//   4: text to encode with the TikToken fixture tokenizer (Kimi's pattern and specials, loaded
//      once), checked as in 0, and valid UTF-8 must round-trip through decode;
//   5: little-endian int32 ids to decode and stream-decode with the TikToken tokenizer;
//   6: a tiktoken.model text, a NUL byte, then a tokenizer_config.json text, to load (an accepted
//      pair then encodes and decodes the config text);
//   7: Kimi's chunking with small limits (two bytes give them): the chunks must cover the text
//      in order, with at most max_chars characters and no longer whitespace / non-whitespace run.
// Nothing may crash, trip a sanitizer, or emit invalid UTF-8 from decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace {

const loom::Tokenizer& qwen() {
  static const loom::Tokenizer* tokenizer = [] {
    auto loaded = loom::Tokenizer::from_file(LOOM_FIXTURES_DIR "/tokenizer_qwen/tokenizer.json");
    if (!loaded.ok()) std::abort();
    return loaded->release();
  }();
  return *tokenizer;
}

const loom::Tokenizer& kimi() {
  static const loom::Tokenizer* tokenizer = [] {
    auto loaded = loom::Tokenizer::from_dir(LOOM_FIXTURES_DIR "/tokenizer_tiktoken_kimi");
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

void check_round_trip(const loom::Tokenizer& tokenizer, std::string_view text) {
  if (!valid_utf8(text)) return;
  for (bool allow_special : {true, false}) {
    auto decoded = tokenizer.decode(tokenizer.encode(text, allow_special));
    if (!decoded.ok() || *decoded != text) std::abort();
  }
}

void check_chunks(std::string_view rest) {
  if (rest.size() < 2) return;
  const size_t max_chars = 1 + static_cast<uint8_t>(rest[0]) % 16;
  const size_t max_run = 1 + static_cast<uint8_t>(rest[1]) % 8;
  const std::string_view text = rest.substr(2);
  std::vector<loom::Tokenizer::Range> chunks;
  loom::tokenizer_internal::kimi_chunks(text, max_chars, max_run, &chunks);
  size_t expected_begin = 0;
  for (const auto& chunk : chunks) {
    if (chunk.begin != expected_begin || chunk.end <= chunk.begin) std::abort();
    expected_begin = chunk.end;
    // Characters as the chunker counts them: a complete valid sequence, or one invalid byte.
    size_t chars = 0, run = 0;
    int previous = -1;
    for (size_t i = chunk.begin; i < chunk.end; ++chars) {
      size_t len = 0;
      const int32_t cp = loom::tokenizer_internal::utf8_decode_at(text, i, &len);
      const int space = loom::tokenizer_internal::is_python_space(cp) ? 1 : 0;
      run = space == previous ? run + 1 : 1;
      previous = space;
      if (run > max_run) std::abort();
      i += len;
    }
    if (chars > max_chars) std::abort();
  }
  if (expected_begin != text.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8) {
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
    case 4:
      check_encode(kimi(), rest);
      check_round_trip(kimi(), rest);
      break;
    case 5: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      for (int32_t& id : ids) id = id % 4 == 0 ? id : (id & 0xFFF);  // mostly valid ids
      check_decode(kimi(), ids);
      break;
    }
    case 6: {
      const size_t nul = rest.find('\0');
      if (nul == std::string_view::npos) break;
      auto tokenizer = loom::Tokenizer::from_tiktoken(rest.substr(0, nul), rest.substr(nul + 1));
      if (tokenizer.ok()) {
        const std::string_view text = rest.substr(nul + 1, 256);
        check_encode(**tokenizer, text);
        check_round_trip(**tokenizer, text);
      }
      break;
    }
    case 7:
      check_chunks(rest);
      break;
  }
  return 0;
}
