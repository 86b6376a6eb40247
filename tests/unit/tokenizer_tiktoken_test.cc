// Tests of TikToken-format tokenizers (engine/tokenizer/tiktoken.cc): every case of
// ../shared/fixtures/tokenizer_tiktoken_kimi/cases.json (ids, decoded strings and split pieces as
// tiktoken and Kimi's TikTokenTokenizer.encode produced them), the decode cases' U+FFFD behaviour
// and the streaming detokenizer over them, the Rust-regex -> PCRE2 translation of Kimi's pattern,
// Kimi's 25,000-character chunking, folder loading and malformed files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tokenizer_internal::Regex;

const fs::path kFolder = fs::path(LOOM_FIXTURES_DIR) / "tokenizer_tiktoken_kimi";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const json& cases() {
  static const json* root = new json(json::parse(read_file(kFolder / "cases.json")));
  return *root;
}

const Tokenizer& kimi() {
  static const Tokenizer* tokenizer = [] {
    auto loaded = Tokenizer::from_dir(kFolder.string());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? loaded->release() : nullptr;
  }();
  return *tokenizer;
}

std::string hex(std::string_view bytes) {
  std::string out;
  for (char c : bytes) {
    char buf[3];
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<uint8_t>(c));
    out += buf;
  }
  return out;
}

// Streams ids; returns the text emitted before finish() and (in *tail) what finish() returned.
std::string stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, std::string* tail) {
  StreamingDetokenizer detok(tokenizer);
  std::string out;
  for (int32_t id : ids) {
    auto delta = detok.push(id);
    EXPECT_TRUE(delta.ok()) << delta.status();
    if (delta.ok()) out += *delta;
  }
  *tail = detok.finish();
  return out;
}

TEST(TikTokenFixture, LoadsKimiLayout) {
  ASSERT_NE(&kimi(), nullptr);
  EXPECT_EQ(Tokenizer::format_in_dir(kFolder.string()), "tiktoken.model");
  const json& root = cases();
  const int32_t num_base = root.at("num_base_tokens");
  ASSERT_EQ(num_base, 1996);
  EXPECT_EQ(kimi().vocab_size(), num_base + 258);
  ASSERT_EQ(root.at("special_tokens").size(), 258u);
  for (auto it = root.at("special_tokens").begin(); it != root.at("special_tokens").end(); ++it) {
    const int32_t id = it.value();
    EXPECT_EQ(kimi().token_id(it.key()), id) << it.key();
    EXPECT_TRUE(kimi().is_special(id)) << it.key();
    EXPECT_EQ(kimi().token_bytes(id), it.key());
    // Every special token is matched in text, also the reserved ones past the model's vocabulary.
    EXPECT_EQ(kimi().encode(it.key()), std::vector<int32_t>{id}) << it.key();
  }
  EXPECT_EQ(kimi().token_id("[BOS]"), root.at("bos_id").get<int32_t>());
  EXPECT_EQ(kimi().token_id("[EOS]"), root.at("eos_id").get<int32_t>());
  EXPECT_EQ(kimi().token_id("[PAD]"), root.at("pad_id").get<int32_t>());
  EXPECT_EQ(kimi().token_id("[UNK]"), root.at("unk_id").get<int32_t>());
  EXPECT_EQ(kimi().token_id("<|im_end|>"), 1998);
  EXPECT_EQ(kimi().token_id("<|reserved_token_2252|>"), 2252);
  EXPECT_FALSE(kimi().is_special(0));
  EXPECT_FALSE(kimi().token_bytes(num_base + 258).has_value());
  // Base tokens are spelled as Kimi's convert_ids_to_tokens does (GPT-2 byte characters).
  EXPECT_EQ(kimi().token_id("!"), 0);
  const std::vector<int32_t> space = kimi().encode(" ");
  ASSERT_EQ(space.size(), 1u);
  EXPECT_EQ(kimi().token_id("\xC4\xA0"), space[0]);  // "Ġ"
}

TEST(TikTokenFixture, EncodesEveryCase) {
  const json& all = cases().at("cases");
  ASSERT_EQ(all.size(), 300u);
  int passed = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string text = all[i].at("text");
    const auto expected = all[i].at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = kimi().encode(text);
    EXPECT_EQ(ids, expected) << "case " << i << ": " << json(text).dump().substr(0, 200);
    passed += ids == expected;
    // The chat path: special tokens allowed everywhere through one range over the whole text.
    const std::vector<Tokenizer::Range> whole = {{0, text.size()}};
    EXPECT_EQ(kimi().encode_with_special_ranges(text, whole), expected) << "case " << i;
  }
  std::printf("tokenizer_tiktoken_kimi: encode %d/%zu cases\n", passed, all.size());
}

TEST(TikTokenFixture, DecodesAndStreamsEveryCase) {
  const json& all = cases().at("cases");
  int passed = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto ids = all[i].at("ids").get<std::vector<int32_t>>();
    const std::string expected = all[i].at("decoded");
    auto text = kimi().decode(ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, expected) << "case " << i;
    std::string tail;
    const std::string streamed = stream(kimi(), ids, &tail);
    EXPECT_EQ(streamed + tail, expected) << "case " << i;
    passed += *text == expected && streamed + tail == expected;
  }
  std::printf("tokenizer_tiktoken_kimi: decode %d/%zu cases\n", passed, all.size());
}

// The fixture's split of each text into special tokens and pattern matches, against Loom's
// translated pattern (what the ids depend on; a failure here says which piece differs).
TEST(TikTokenFixture, SplitsEveryCaseIntoTheFixturePieces) {
  auto pattern = tokenizer_internal::translate_rust_pattern(tokenizer_internal::kKimiPattern);
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  auto regex = Regex::compile(*pattern, /*literal=*/false);
  ASSERT_TRUE(regex.ok()) << regex.status();
  std::vector<std::string> specials;
  for (auto it = cases().at("special_tokens").begin(); it != cases().at("special_tokens").end();
       ++it)
    specials.push_back(it.key());
  int checked = 0;
  for (const json& c : cases().at("cases")) {
    if (!c.contains("pieces")) continue;
    const std::string text = c.at("text");
    std::vector<std::string> pieces;
    size_t segment = 0;
    auto split = [&](size_t end) {
      const std::string_view part = std::string_view(text).substr(segment, end - segment);
      size_t pos = 0, b = 0, e = 0;
      while (pos < part.size() && (*regex)->find(part, pos, &b, &e)) {
        EXPECT_EQ(b, pos) << "unmatched text in " << json(text).dump();
        pieces.emplace_back(part.substr(b, e - b));
        pos = e;
      }
    };
    for (size_t pos = 0; pos < text.size();) {
      size_t longest = 0;
      for (const std::string& s : specials)
        if (s.size() > longest && text.compare(pos, s.size(), s) == 0) longest = s.size();
      if (longest == 0) {
        ++pos;
        continue;
      }
      split(pos);
      pieces.push_back(text.substr(pos, longest));
      pos += longest;
      segment = pos;
    }
    split(text.size());
    EXPECT_EQ(pieces, c.at("pieces").get<std::vector<std::string>>()) << json(text).dump();
    ++checked;
  }
  EXPECT_EQ(checked, 297);
}

// decode_cases: prefixes of encodings ending inside a UTF-8 sequence decode with U+FFFD, as
// tiktoken's decode does; the streaming detokenizer holds those bytes back until finish().
TEST(TikTokenFixture, DecodeCases) {
  const json& all = cases().at("decode_cases");
  ASSERT_EQ(all.size(), 90u);
  int passed = 0, held_back = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto ids = all[i].at("ids").get<std::vector<int32_t>>();
    const std::string expected = all[i].at("decoded");
    std::string bytes;
    for (int32_t id : ids) bytes += std::string(*kimi().token_bytes(id));
    EXPECT_EQ(hex(bytes), all[i].at("bytes_hex").get<std::string>()) << "decode case " << i;
    auto text = kimi().decode(ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, expected) << "decode case " << i;
    std::string tail;
    const std::string streamed = stream(kimi(), ids, &tail);
    EXPECT_EQ(streamed + tail, expected) << "decode case " << i;
    // What the stream held back is at most the one trailing U+FFFD of an incomplete sequence.
    EXPECT_TRUE(tail.empty() || tail == kReplacement) << "decode case " << i;
    held_back += !tail.empty();
    passed += *text == expected && streamed + tail == expected;
  }
  EXPECT_GT(held_back, 20);
  std::printf("tokenizer_tiktoken_kimi: decode_cases %d/%zu\n", passed, all.size());
  // The first case is the lone first byte of 你: nothing is emitted until finish().
  std::string tail;
  EXPECT_EQ(stream(kimi(), all[0].at("ids").get<std::vector<int32_t>>(), &tail), "");
  EXPECT_EQ(tail, kReplacement);
}

TEST(TikToken, SpecialTokensDisallowedAreText) {
  const std::string text = "a<|im_end|>b[BOS]";
  const std::vector<int32_t> with = kimi().encode(text);
  EXPECT_NE(std::find(with.begin(), with.end(), 1998), with.end());
  EXPECT_NE(std::find(with.begin(), with.end(), 1996), with.end());
  const std::vector<int32_t> without = kimi().encode(text, /*allow_special=*/false);
  for (int32_t id : without) EXPECT_FALSE(kimi().is_special(id));
  EXPECT_EQ(*kimi().decode(without), text);
  EXPECT_EQ(*kimi().decode(with), text);
  EXPECT_EQ(*kimi().decode(with, /*skip_special=*/true), "ab");
  // Only inside the given range: the marker [1, 11) is special, [BOS] outside it is text.
  const std::vector<Tokenizer::Range> ranges = {{1, 11}};
  const std::vector<int32_t> ranged = kimi().encode_with_special_ranges(text, ranges);
  EXPECT_NE(std::find(ranged.begin(), ranged.end(), 1998), ranged.end());
  EXPECT_EQ(std::find(ranged.begin(), ranged.end(), 1996), ranged.end());
  EXPECT_EQ(*kimi().decode(ranged), text);
}

TEST(TikToken, InvalidUtf8IsKeptAsBytes) {
  const std::string text = "ab\xFF\xE4\xB8 c\x80世界";
  std::string bytes;
  for (int32_t id : kimi().encode(text)) bytes += std::string(*kimi().token_bytes(id));
  EXPECT_EQ(bytes, text);
}

// ------------------------------------------------------------------------------------------------
// Pattern translation

std::vector<std::string> split(std::string_view rust_pattern, std::string_view text) {
  auto pattern = tokenizer_internal::translate_rust_pattern(rust_pattern);
  EXPECT_TRUE(pattern.ok()) << pattern.status();
  if (!pattern.ok()) return {};
  auto regex = Regex::compile(*pattern, false);
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<std::string> out;
  size_t pos = 0, b = 0, e = 0;
  while (pos < text.size() && (*regex)->find(text, pos, &b, &e) && e > b) {
    out.emplace_back(text.substr(b, e - b));
    pos = e;
  }
  return out;
}

using Pieces = std::vector<std::string>;

TEST(TranslateRustPattern, Intersection) {
  auto out = tokenizer_internal::translate_rust_pattern(R"([\p{Lu}\p{M}&&[^\p{Han}]]+)");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, R"((?:(?![\p{sc:Han}])[\p{Lu}\p{M}])+)");
  // Positive operand, difference, chains.
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern("[a-z&&[aeiou]]"), "(?:(?=[aeiou])[a-z])");
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern("[a-z--aeiou]"), "(?:(?![aeiou])[a-z])");
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern("[a-z--[aeiou]&&[^x]]"),
            "(?:(?![aeiou])(?![x])[a-z])");
  EXPECT_EQ(split("[a-z--aeiou]+", "bcdaxyz"), (Pieces{"bcd", "xyz"}));
  EXPECT_EQ(split("[a-z&&[aeiou]]+", "bcdaexyz"), (Pieces{"ae"}));
  // Plain classes and escapes are unchanged.
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern(R"([^\r\n\p{L}\p{N}]?\p{N}{1,3})"),
            R"([^\r\n\p{L}\p{N}]?\p{N}{1,3})");
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern(R"([]a]\]x\{)"), R"([]a]\]x\{)");
}

TEST(TranslateRustPattern, HanIsTheScriptNotItsExtensions) {
  EXPECT_EQ(*tokenizer_internal::translate_rust_pattern(R"(\p{Han}\P{Han}[\p{Han}])"),
            R"(\p{sc:Han}\P{sc:Han}[\p{sc:Han}])");
  // U+3001 (、) has Script=Common, Script_Extensions including Han: not part of a Han run.
  EXPECT_EQ(split(R"([\p{Han}]+|[^\p{Han}]+)", "世界、東京"), (Pieces{"世界", "、", "東京"}));
  EXPECT_EQ(split(R"(\p{Han}+|\P{Han}+)", "世、"), (Pieces{"世", "、"}));
}

TEST(TranslateRustPattern, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+180E (Mongolian vowel separator) is not White_Space (PCRE2's UCP \s has it); U+0085 is.
  EXPECT_EQ(split(R"(\s+|\S+)",
                  "a\xE1\xA0\x8E"
                  "b \xC2\x85\t"),
            (Pieces{"a\xE1\xA0\x8E"
                    "b",
                    " \xC2\x85\t"}));
  EXPECT_EQ(split(R"([^\s]+|[\s]+)", "\xE1\xA0\x8E\xE3\x80\x80x"),
            (Pieces{"\xE1\xA0\x8E", "\xE3\x80\x80", "x"}));
}

TEST(TranslateRustPattern, KimiPattern) {
  using tokenizer_internal::kKimiPattern;
  auto out = tokenizer_internal::translate_rust_pattern(kKimiPattern);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->find("&&"), std::string::npos);
  EXPECT_EQ(std::string(kKimiPattern), cases().at("pat_str").get<std::string>());
  // Han separates from other letters (the intersection must not be dropped).
  EXPECT_EQ(split(kKimiPattern, "hello世界"), (Pieces{"hello", "世界"}));
  EXPECT_EQ(split(kKimiPattern, "世界hello"), (Pieces{"世界", "hello"}));
  EXPECT_EQ(split(kKimiPattern, "Привет世界мир"), (Pieces{"Привет", "世界", "мир"}));
  // Contractions are case-insensitive with Unicode folding: 'ſ (long s) is 's.
  EXPECT_EQ(split(kKimiPattern, "it'ſ I'LL"), (Pieces{"it'ſ", " I'LL"}));
  EXPECT_EQ(split(kKimiPattern, "12345 \n\n x"), (Pieces{"123", "45", " \n\n", " x"}));
}

// Kimi's longest pieces (runs of 25,000 characters) match whole: PCRE2's JIT stack (or the
// interpreter behind it) must not give up half way, which would leave the rest unsplit.
TEST(TranslateRustPattern, KimiPatternMatchesLongRunsWhole) {
  auto pattern = tokenizer_internal::translate_rust_pattern(tokenizer_internal::kKimiPattern);
  ASSERT_TRUE(pattern.ok());
  auto regex = Regex::compile(*pattern, false);
  ASSERT_TRUE(regex.ok());
  const std::pair<const char*, const char*> runs[] = {
      {"\xC3\xA9", "!"},              // lowercase letters (é), then punctuation
      {"\xD0\x96", "1"},              // uppercase letters (Ж)
      {"a\xCC\x81", "\xE4\xB8\x96"},  // letters with combining marks, then Han
      {"\xE4\xB8\x96", "a"},          // Han
      {" ", "x"},                     // spaces: \s+(?!\S) backtracks one
      {"!", "a"},                     // punctuation
  };
  for (const auto& [unit, stop] : runs) {
    std::string text;
    for (size_t i = 0; i < tokenizer_internal::kKimiMaxRunChars; ++i) text += unit;
    const size_t run = text.size();
    text += stop;
    size_t b = 0, e = 0;
    ASSERT_TRUE((*regex)->find(text, 0, &b, &e)) << unit;
    EXPECT_EQ(b, 0u) << unit;
    // A space run leaves its last space to the next piece (" x").
    EXPECT_EQ(e, std::string_view(unit) == " " ? run - 1 : run) << unit;
  }
}

TEST(TranslateRustPattern, RejectsWhatHasNoExactTranslation) {
  for (const char* bad : {R"(\w+)", R"(\bx)", R"([\S])", R"([^a&&b])", R"([a[bc]])", "[a~~b]",
                          "[abc", R"(\p{L)", "[&&a]", "x\\"}) {
    auto out = tokenizer_internal::translate_rust_pattern(bad);
    EXPECT_FALSE(out.ok()) << bad << " -> " << *out;
  }
}

// ------------------------------------------------------------------------------------------------
// Chunking (Kimi's _split_whitespaces_or_nonwhitespaces after 400,000-character slices)

std::vector<std::string> chunks(std::string_view text, size_t max_chars, size_t max_run) {
  std::vector<Tokenizer::Range> ranges;
  tokenizer_internal::kimi_chunks(text, max_chars, max_run, &ranges);
  std::vector<std::string> out;
  for (const auto& r : ranges) out.emplace_back(text.substr(r.begin, r.end - r.begin));
  return out;
}

TEST(KimiChunks, SplitsLongRunsOnly) {
  EXPECT_EQ(chunks("aaaaa bb", 100, 2), (Pieces{"aa", "aa", "a bb"}));
  EXPECT_EQ(chunks("ab   cd", 100, 2), (Pieces{"ab  ", " cd"}));
  EXPECT_EQ(chunks("abcdefg", 3, 100), (Pieces{"abc", "def", "g"}));
  EXPECT_EQ(chunks("", 3, 2), Pieces{});
  // Characters, not bytes; U+001C..U+001F are spaces to Python's isspace, U+180E is not.
  EXPECT_EQ(chunks("世界世界", 100, 3), (Pieces{"世界世", "界"}));
  EXPECT_EQ(chunks("\x1C\x1D\x1Fx", 100, 2), (Pieces{"\x1C\x1D", "\x1Fx"}));
  EXPECT_EQ(chunks(" \xE1\xA0\x8E\xE1\xA0\x8E", 100, 2), (Pieces{" \xE1\xA0\x8E\xE1\xA0\x8E"}));
  EXPECT_TRUE(tokenizer_internal::is_python_space(0x85));
  EXPECT_TRUE(tokenizer_internal::is_python_space(0x3000));
  EXPECT_FALSE(tokenizer_internal::is_python_space(0x200B));
}

// Python's str.isspace over every code point (CPython 3.11, Unicode 14).
TEST(KimiChunks, PythonIsSpaceExactly) {
  const std::vector<int32_t> expected = {
      0x9,    0xA,    0xB,    0xC,    0xD,    0x1C,   0x1D,   0x1E,   0x1F,   0x20,
      0x85,   0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
      0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  std::vector<int32_t> got;
  for (int32_t cp = 0; cp <= 0x10FFFF; ++cp)
    if (tokenizer_internal::is_python_space(cp)) got.push_back(cp);
  EXPECT_EQ(got, expected);
  EXPECT_FALSE(tokenizer_internal::is_python_space(-1));  // an invalid byte
}

TEST(KimiChunks, FixtureLongRunsWereCutThere) {
  int seen = 0;
  for (const json& c : cases().at("cases")) {
    if (!c.contains("kimi_chunks")) continue;
    ++seen;
    const std::string text = c.at("text");
    std::vector<Tokenizer::Range> ranges;
    tokenizer_internal::kimi_chunks(text, tokenizer_internal::kKimiMaxEncodeChars,
                                    tokenizer_internal::kKimiMaxRunChars, &ranges);
    EXPECT_EQ(ranges.size(), c.at("kimi_chunks").get<size_t>());
    // The cut falls after exactly kKimiMaxRunChars characters of the run.
    size_t chars = 0;
    for (size_t i = ranges[0].begin; i < ranges[0].end; ++i)
      chars += (static_cast<uint8_t>(text[i]) & 0xC0) != 0x80;
    EXPECT_GE(chars, tokenizer_internal::kKimiMaxRunChars);
  }
  EXPECT_EQ(seen, 2);
}

// ------------------------------------------------------------------------------------------------
// Loading and malformed files

// A small valid tiktoken.model: the 256 bytes, then "ab" and "abc".
std::string base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::vector<std::string> small_model_lines() {
  std::vector<std::string> lines;
  for (int b = 0; b < 256; ++b)
    lines.push_back(base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b));
  lines.push_back(base64("ab") + " 256");
  lines.push_back(base64("abc") + " 257");
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

constexpr std::string_view kConfig = R"({
  "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]},
  "added_tokens_decoder": {"258": {"content": "[BOS]", "special": true},
                           "259": {"content": "<|im_end|>", "special": true}}})";

void expect_error(const absl::StatusOr<std::unique_ptr<Tokenizer>>& result,
                  std::string_view needle) {
  ASSERT_FALSE(result.ok()) << needle;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(result.status().message()).find(needle), std::string::npos)
      << result.status().message() << "\n  expected: " << needle;
}

TEST(TikTokenLoad, SmallModel) {
  auto tokenizer = Tokenizer::from_tiktoken(join(small_model_lines()), kConfig);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 258 + 258);
  EXPECT_EQ((*tokenizer)->encode("abc"), std::vector<int32_t>{257});
  EXPECT_EQ((*tokenizer)->encode("abab[BOS]"), (std::vector<int32_t>{256, 256, 258}));
  EXPECT_EQ((*tokenizer)->encode("<|reserved_token_515|>"), std::vector<int32_t>{515});
  EXPECT_EQ((*tokenizer)->token_id("<|im_end|>"), 259);
  // CRLF line ends and blank lines are accepted, as tiktoken's loader does.
  std::string crlf;
  for (const std::string& l : small_model_lines()) crlf += l + "\r\n\n";
  EXPECT_TRUE(Tokenizer::from_tiktoken(crlf, kConfig).ok());
}

TEST(TikTokenLoad, MalformedModel) {
  auto with_line = [](size_t index, const std::string& line) {
    std::vector<std::string> lines = small_model_lines();
    lines[index] = line;
    return join(lines);
  };
  expect_error(Tokenizer::from_tiktoken(with_line(2, "Ag=! 2"), kConfig),
               "tiktoken.model line 3: 'Ag=!' is not valid base64");
  expect_error(Tokenizer::from_tiktoken(with_line(2, "Ag== -2"), kConfig),
               "tiktoken.model line 3: rank '-2' is not a non-negative integer");
  expect_error(Tokenizer::from_tiktoken(with_line(2, "Ag== x"), kConfig),
               "tiktoken.model line 3: rank 'x'");
  expect_error(Tokenizer::from_tiktoken(with_line(2, "Ag=="), kConfig),
               "tiktoken.model line 3: expected 'base64 rank', found 1 fields");
  expect_error(Tokenizer::from_tiktoken(with_line(257, base64("ab") + " 5"), kConfig),
               "tiktoken.model line 258: rank 5 already given on line 6");
  expect_error(Tokenizer::from_tiktoken(with_line(257, base64("xyz") + " 999"), kConfig),
               "tiktoken.model line 258: rank 999 but only 258 tokens");
  expect_error(Tokenizer::from_tiktoken(with_line(257, base64("\x05") + " 257"), kConfig),
               "tiktoken.model line 258: token 'BQ==' already given on line 6");
  expect_error(Tokenizer::from_tiktoken(with_line(7, base64("zz") + " 7"), kConfig),
               "no token for the single byte 0x07");
  expect_error(Tokenizer::from_tiktoken("", kConfig), "tiktoken.model line 0: no tokens");
}

TEST(TikTokenLoad, MalformedConfig) {
  const std::string model = join(small_model_lines());
  expect_error(Tokenizer::from_tiktoken(model, "{"), "tokenizer_config.json: not valid JSON");
  expect_error(Tokenizer::from_tiktoken(model, R"({"tokenizer_class": "TikTokenTokenizer"})"),
               "tokenizer_config.json: auto_map.AutoTokenizer: missing");
  expect_error(
      Tokenizer::from_tiktoken(model, R"({"auto_map": {"AutoTokenizer": ["tok.Other", null]}})"),
      "auto_map.AutoTokenizer: 'tok.Other': Loom knows the split pattern of "
      "tokenization_kimi.TikTokenTokenizer only");
  const std::string head =
      R"({"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer"]},
    "added_tokens_decoder": )";
  expect_error(Tokenizer::from_tiktoken(model, head + R"({"12": {"content": "x"}}})"),
               "added_tokens_decoder[\"12\"]: id 12 is outside the special ids [258, 516)");
  expect_error(Tokenizer::from_tiktoken(model, head + R"({"300": {"special": true}}})"),
               "added_tokens_decoder[\"300\"].content: missing");
  expect_error(Tokenizer::from_tiktoken(model, head + R"({"x1": {"content": "x"}}})"),
               "added_tokens_decoder[\"x1\"]: the key is not a token id");
  expect_error(Tokenizer::from_tiktoken(
                   model, head + R"({"300": {"content": "A"}, "301": {"content": "A"}}})"),
               "'A' also names id 300");
  // A repository-qualified class is the same class.
  EXPECT_TRUE(Tokenizer::from_tiktoken(model, R"({"auto_map": {"AutoTokenizer":
                      ["moonshotai/Kimi-K2--tokenization_kimi.TikTokenTokenizer", null]}})")
                  .ok());
}

TEST(TikTokenLoad, FromDirChoosesTheFormat) {
  const fs::path dir = fs::path(LOOM_TEST_TMPDIR) / "tokenizer_tiktoken_load";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Neither file: NotFound.
  EXPECT_EQ(Tokenizer::format_in_dir(dir.string()), "");
  EXPECT_EQ(Tokenizer::from_dir(dir.string()).status().code(), absl::StatusCode::kNotFound);
  // tiktoken.model without its config.
  std::ofstream(dir / "tiktoken.model") << join(small_model_lines());
  EXPECT_EQ(Tokenizer::format_in_dir(dir.string()), "tiktoken.model");
  expect_error(Tokenizer::from_dir(dir.string()), "tokenizer_config.json: missing");
  std::ofstream(dir / "tokenizer_config.json") << kConfig;
  auto loaded = Tokenizer::from_dir(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->encode("abc"), std::vector<int32_t>{257});
  // Errors name the file's path and line.
  std::ofstream(dir / "tiktoken.model") << "QQ== 0\n!! 1\n";
  expect_error(Tokenizer::from_dir(dir.string()),
               (dir / "tiktoken.model").string() + " line 2: '!!' is not valid base64");
  // tokenizer.json wins when both are present.
  fs::copy_file(fs::path(LOOM_FIXTURES_DIR) / "tokenizer_qwen" / "tokenizer.json",
                dir / "tokenizer.json");
  EXPECT_EQ(Tokenizer::format_in_dir(dir.string()), "tokenizer.json");
  EXPECT_TRUE(Tokenizer::from_dir(dir.string()).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
