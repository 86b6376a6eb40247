// TikToken-format tokenizers: loading tiktoken.model + tokenizer_config.json into loom::Tokenizer
// (Tokenizer::from_tiktoken, from_dir), the Rust-regex -> PCRE2 translation of the split pattern
// and Kimi's chunking. Encoding and decoding are tokenizer.cc's, shared with tokenizer.json.
#include "engine/tokenizer/tiktoken.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace tokenizer_internal {

// ------------------------------------------------------------------------------------------------
// Pattern translation

namespace {

// Unicode White_Space (what Rust's \s matches) as PCRE2 class items.
constexpr std::string_view kWhiteSpaceItems =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

absl::Status pattern_error(size_t offset, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("pattern offset ", offset, ": ", absl_sv(what)));
}

// Translates the escape at p[*i] == '\\' and advances past it.
absl::StatusOr<std::string> translate_escape(std::string_view p, size_t* i, bool in_class) {
  const size_t at = *i;
  if (at + 1 >= p.size()) return pattern_error(at, "trailing backslash");
  const char c = p[at + 1];
  switch (c) {
    case 's':
      *i += 2;
      return in_class ? std::string(kWhiteSpaceItems)
                      : absl::StrCat("[", absl_sv(kWhiteSpaceItems), "]");
    case 'S':
      if (in_class) return pattern_error(at, "\\S inside a class is not supported");
      *i += 2;
      return absl::StrCat("[^", absl_sv(kWhiteSpaceItems), "]");
    case 'w':
    case 'W':
    case 'b':
    case 'B':
      return pattern_error(at,
                           absl::StrCat("\\", std::string(1, c),
                                        " has no exact PCRE2 equivalent (Unicode \\w differs)"));
    case 'p':
    case 'P': {
      std::string name;
      if (at + 2 < p.size() && p[at + 2] == '{') {
        const size_t close = p.find('}', at + 3);
        if (close == std::string_view::npos) return pattern_error(at, "unterminated \\p{");
        name = std::string(p.substr(at + 3, close - at - 3));
        *i = close + 1;
      } else {
        if (at + 2 >= p.size()) return pattern_error(at, "\\p without a property");
        name = std::string(1, p[at + 2]);
        *i = at + 3;
      }
      // Rust resolves a bare script name to Script; PCRE2 10.40+ to Script_Extensions.
      if (name == "Han" || name == "Hani") name = "sc:Han";
      return absl::StrCat("\\", std::string(1, c), "{", name, "}");
    }
    default:
      *i += 2;
      return std::string(p.substr(at, 2));
  }
}

// Translates the class starting at p[*i] == '[' and advances past its closing ']'.
absl::StatusOr<std::string> translate_class(std::string_view p, size_t* i, int depth) {
  const size_t start = *i;
  if (depth > 8) return pattern_error(start, "classes nested too deeply");
  ++*i;
  bool negated = false;
  if (*i < p.size() && p[*i] == '^') {
    negated = true;
    ++*i;
  }
  struct Operand {
    std::string items;   // plain class items
    std::string nested;  // or one nested class, translated
  };
  std::vector<Operand> operands(1);
  std::vector<char> ops;  // ops[k] combines operands[k + 1] into the result: '&' or '-'
  bool at_start = true;   // a ']' right after '[' or '[^' is a literal
  while (true) {
    if (*i >= p.size()) return pattern_error(start, "unterminated class");
    const char c = p[*i];
    const char next = *i + 1 < p.size() ? p[*i + 1] : '\0';
    Operand& current = operands.back();
    if (c == ']' && !at_start) {
      ++*i;
      break;
    }
    at_start = false;
    if (c == '\\') {
      if (!current.nested.empty()) return pattern_error(*i, "a nested class used as a union");
      LOOM_ASSIGN_OR_RETURN(const std::string escape, translate_escape(p, i, /*in_class=*/true));
      current.items += escape;
    } else if ((c == '&' && next == '&') || (c == '-' && next == '-')) {
      if (current.items.empty() && current.nested.empty())
        return pattern_error(*i, "a class set operation without a left operand");
      ops.push_back(c);
      operands.emplace_back();
      *i += 2;
    } else if (c == '~' && next == '~') {
      return pattern_error(*i, "class symmetric difference (~~) is not supported");
    } else if (c == '[' && next == ':') {  // POSIX [:name:], the same in both dialects
      const size_t close = p.find(":]", *i + 2);
      if (close == std::string_view::npos) return pattern_error(*i, "unterminated [:");
      if (!current.nested.empty()) return pattern_error(*i, "a nested class used as a union");
      current.items += p.substr(*i, close + 2 - *i);
      *i = close + 2;
    } else if (c == '[') {
      if (!current.items.empty() || !current.nested.empty())
        return pattern_error(*i, "a nested class used as a union");
      LOOM_ASSIGN_OR_RETURN(current.nested, translate_class(p, i, depth + 1));
    } else {
      if (!current.nested.empty()) return pattern_error(*i, "a nested class used as a union");
      current.items += c;
      ++*i;
    }
  }
  auto text_of = [](const Operand& o) { return o.nested.empty() ? "[" + o.items + "]" : o.nested; };
  if (operands.back().items.empty() && operands.back().nested.empty())
    return pattern_error(start, "an empty class or class operand");
  if (ops.empty()) {
    if (operands[0].nested.empty())
      return absl::StrCat(negated ? "[^" : "[", operands[0].items, "]");
    if (negated) return pattern_error(start, "a negated class around a nested class");
    return operands[0].nested;
  }
  if (negated) return pattern_error(start, "a negated class with a set operation");
  // [A && B -- C] -> (?:(?=B)(?!C)[A]); a negated simple class operand [^X] under && becomes
  // (?![X]) (the same set, read more easily).
  std::string out = "(?:";
  for (size_t k = 0; k < ops.size(); ++k) {
    const std::string operand = text_of(operands[k + 1]);
    const bool simple_negated = operand.size() > 3 && operand.compare(0, 2, "[^") == 0 &&
                                operand.back() == ']' && operand.find('[', 1) == std::string::npos;
    if (ops[k] == '&' && simple_negated) {
      absl::StrAppend(&out, "(?![", operand.substr(2));
      out += ")";
    } else {
      absl::StrAppend(&out, ops[k] == '&' ? "(?=" : "(?!", operand, ")");
    }
  }
  absl::StrAppend(&out, text_of(operands[0]), ")");
  return out;
}

}  // namespace

absl::StatusOr<std::string> translate_rust_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      LOOM_ASSIGN_OR_RETURN(const std::string escape,
                            translate_escape(pattern, &i, /*in_class=*/false));
      out += escape;
    } else if (c == '[') {
      LOOM_ASSIGN_OR_RETURN(const std::string cls, translate_class(pattern, &i, 0));
      out += cls;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// Chunking

bool is_python_space(int32_t cp) { return (cp >= 0x1C && cp <= 0x1F) || is_white_space(cp); }

void kimi_chunks(std::string_view text, size_t max_chars, size_t max_run,
                 std::vector<Tokenizer::Range>* out) {
  // for i in range(0, len(text), max_chars): _split_whitespaces_or_nonwhitespaces(text[i:i+max])
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos, run = 0, chars = 0, i = pos, len = 0;
    bool run_space = is_python_space(utf8_decode_at(text, pos, &len));
    while (i < text.size() && chars < max_chars) {
      const bool space = is_python_space(utf8_decode_at(text, i, &len));
      if (space != run_space) {
        run = 1;
        run_space = space;
      } else if (++run > max_run) {
        out->push_back({start, i});
        start = i;
        run = 1;
      }
      i += len;
      ++chars;
    }
    out->push_back({start, i});
    pos = i;
  }
}

}  // namespace tokenizer_internal

// ------------------------------------------------------------------------------------------------
// Loading

namespace {

using json = nlohmann::json;
using namespace tokenizer_internal;  // NOLINT(build/namespaces): .cc-local convenience

constexpr int64_t kMaxRanks = 1 << 24;  // as tokenizer.json's id limit: bounds per-id tables
constexpr size_t kMaxFileBytes = size_t{1} << 30;
constexpr std::string_view kModelFile = "tiktoken.model";
constexpr std::string_view kConfigFile = "tokenizer_config.json";

absl::Status model_error(size_t line, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(absl_sv(kModelFile), " line ", line, ": ", absl_sv(what)));
}

absl::Status config_error(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(absl_sv(kConfigFile), ": ", absl_sv(field),
                                                 field.empty() ? "" : ": ", absl_sv(what)));
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with padding (what tiktoken's files hold). False on anything else.
bool base64_decode(std::string_view in, std::string* out) {
  if (in.empty() || in.size() % 4 != 0) return false;
  out->clear();
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=') : 0;
    int v[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4 - pad; ++k) {
      v[k] = base64_value(in[i + k]);
      if (v[k] < 0) return false;
    }
    const uint32_t bits = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out->push_back(static_cast<char>(bits >> 16));
    if (pad < 2) out->push_back(static_cast<char>((bits >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(bits & 0xFF));
    // Non-canonical padding bits (e.g. "QR==") would alias another encoding: reject them.
    if ((pad == 2 && (v[1] & 0xF) != 0) || (pad == 1 && (v[2] & 0x3) != 0)) return false;
  }
  return true;
}

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// tiktoken.model: one "base64(token bytes) rank" per line (blank lines skipped), as tiktoken's
// load_tiktoken_bpe reads it; stricter: the ranks must be 0..n-1, each once, every token distinct,
// and every single byte a token (tiktoken's BPE needs that).
absl::Status parse_model(std::string_view text, std::vector<std::string>* tokens) {
  if (text.size() > kMaxFileBytes) return model_error(0, "larger than 1 GiB");
  // Sized by what the file holds, never by a rank's value (a hostile rank must not allocate).
  absl::flat_hash_map<std::string, size_t> line_of_token;
  absl::flat_hash_map<int64_t, size_t> line_of_rank;
  std::vector<std::pair<int64_t, std::string>> entries;
  int64_t max_rank = -1;
  size_t max_rank_line = 0;
  std::string bytes;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && is_ascii_space(line[i])) ++i;
      size_t j = i;
      while (j < line.size() && !is_ascii_space(line[j])) ++j;
      if (j > i) fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.size() != 2)
      return model_error(line_no,
                         absl::StrCat("expected 'base64 rank', found ", fields.size(), " fields"));
    if (!base64_decode(fields[0], &bytes))
      return model_error(
          line_no, absl::StrCat("'", absl_sv(fields[0].substr(0, 64)), "' is not valid base64"));
    int64_t rank = 0;
    const std::string_view digits = fields[1];
    if (digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return model_error(line_no, absl::StrCat("rank '", absl_sv(digits.substr(0, 32)),
                                               "' is not a non-negative integer"));
    for (char c : digits) rank = rank * 10 + (c - '0');
    if (rank >= kMaxRanks)
      return model_error(line_no,
                         absl::StrCat("rank ", rank, " out of range [0, ", kMaxRanks, ")"));
    auto [rank_it, new_rank] = line_of_rank.emplace(rank, line_no);
    if (!new_rank)
      return model_error(line_no,
                         absl::StrCat("rank ", rank, " already given on line ", rank_it->second));
    auto [it, inserted] = line_of_token.emplace(bytes, line_no);
    if (!inserted)
      return model_error(line_no, absl::StrCat("token '", absl_sv(fields[0].substr(0, 64)),
                                               "' already given on line ", it->second));
    if (rank > max_rank) {
      max_rank = rank;
      max_rank_line = line_no;
    }
    entries.emplace_back(rank, bytes);
  }
  if (line_of_token.empty()) return model_error(line_no, "no tokens");
  // n distinct ranks: they are 0..n-1 exactly when the largest is n-1.
  if (static_cast<size_t>(max_rank) + 1 != entries.size())
    return model_error(max_rank_line, absl::StrCat("rank ", max_rank, " but only ", entries.size(),
                                                   " tokens (ranks must be 0..n-1)"));
  tokens->assign(entries.size(), std::string());
  for (auto& [rank, token] : entries) (*tokens)[rank] = std::move(token);
  for (int b = 0; b < 256; ++b) {
    if (!line_of_token.contains(std::string(1, static_cast<char>(b))))
      return model_error(line_no, absl::StrFormat("no token for the single byte 0x%02X (every "
                                                  "byte needs a rank)",
                                                  b));
  }
  return absl::OkStatus();
}

// The special tokens of tokenizer_config.json, in Kimi's layout: ids num_base .. num_base +
// kKimiSpecialSlots - 1, named by added_tokens_decoder or <|reserved_token_{id}|>.
absl::Status parse_config(std::string_view text, int32_t num_base,
                          std::vector<AddedToken>* specials) {
  if (text.size() > kMaxFileBytes) return config_error("", "larger than 1 GiB");
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return config_error("", "not valid JSON");
  if (!root.is_object()) return config_error("", "top level is not an object");

  // The split pattern is not in the file: it is known per tokenizer class.
  std::string cls;
  auto auto_map = root.find("auto_map");
  if (auto_map != root.end() && auto_map->is_object()) {
    auto entry = auto_map->find("AutoTokenizer");
    if (entry != auto_map->end() && entry->is_array() && !entry->empty() && (*entry)[0].is_string())
      cls = (*entry)[0].get<std::string>();
  }
  // "module.Class" or "repo--module.Class".
  const size_t dashes = cls.rfind("--");
  const std::string module_class = dashes == std::string::npos ? cls : cls.substr(dashes + 2);
  if (module_class != kKimiTokenizerClass)
    return config_error(
        "auto_map.AutoTokenizer",
        absl::StrCat(cls.empty() ? "missing" : absl::StrCat("'", cls, "'"),
                     ": Loom knows the split pattern of ", absl_sv(kKimiTokenizerClass), " only"));

  std::vector<std::string> names(kKimiSpecialSlots);
  auto decoder = root.find("added_tokens_decoder");
  if (decoder != root.end() && !decoder->is_null()) {
    if (!decoder->is_object()) return config_error("added_tokens_decoder", "not an object");
    for (auto it = decoder->begin(); it != decoder->end(); ++it) {
      const std::string field = absl::StrCat("added_tokens_decoder[\"", it.key(), "\"]");
      const std::string& key = it.key();
      if (key.empty() || key.size() > 9 ||
          !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return config_error(field, "the key is not a token id");
      const int64_t id = std::stoll(key);
      if (id < num_base || id >= num_base + kKimiSpecialSlots)
        return config_error(
            field, absl::StrCat("id ", id, " is outside the special ids [", num_base, ", ",
                                num_base + kKimiSpecialSlots, ") that follow the ", num_base,
                                " ranks of ", absl_sv(kModelFile)));
      auto content = it->is_object() ? it->find("content") : it->end();
      if (!it->is_object() || content == it->end() || !content->is_string() ||
          content->get_ref<const std::string&>().empty())
        return config_error(field + ".content", "missing or not a non-empty string");
      names[id - num_base] = content->get<std::string>();
    }
  }
  absl::flat_hash_map<std::string, int32_t> seen;
  for (int32_t k = 0; k < kKimiSpecialSlots; ++k) {
    const int32_t id = num_base + k;
    AddedToken token;
    token.content = names[k].empty() ? absl::StrCat("<|reserved_token_", id, "|>") : names[k];
    token.id = id;
    token.special = true;
    auto [it, inserted] = seen.emplace(token.content, id);
    if (!inserted)
      return config_error(absl::StrCat("added_tokens_decoder[\"", id, "\"]"),
                          absl::StrCat("'", token.content, "' also names id ", it->second));
    specials->push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_tiktoken(std::string_view model_text,
                                                                    std::string_view config_json) {
  std::vector<std::string> tokens;  // by rank
  LOOM_RETURN_IF_ERROR(parse_model(model_text, &tokens));
  const auto num_base = static_cast<int32_t>(tokens.size());
  std::vector<AddedToken> specials;
  LOOM_RETURN_IF_ERROR(parse_config(config_json, num_base, &specials));

  auto impl = std::make_unique<Impl>();
  impl->tiktoken = true;
  impl->byte_level_input = true;
  LOOM_ASSIGN_OR_RETURN(const std::string pattern, translate_rust_pattern(kKimiPattern));
  PreTokenizerStep split;
  split.kind = PreTokenizerStep::Kind::kSplit;
  split.behavior = SplitBehavior::kIsolated;  // tiktoken's find_iter (every valid text matches)
  LOOM_ASSIGN_OR_RETURN(split.regex, Regex::compile(pattern, /*literal=*/false));
  impl->pre_tokenizers.push_back(std::move(split));

  // Token spellings as Kimi's TikTokenTokenizer gives them (convert_ids_to_tokens): each byte as
  // GPT-2's printable character; the ranks are the ids.
  impl->vocab.reserve(tokens.size());
  impl->piece_ranks.reserve(tokens.size());
  for (int32_t rank = 0; rank < num_base; ++rank) {
    const std::string& bytes = tokens[rank];
    std::string spelling;
    for (char b : bytes) spelling += byte_to_char(static_cast<uint8_t>(b));
    impl->vocab.emplace(std::move(spelling), rank);
    impl->piece_ranks.emplace(bytes, rank);
    if (bytes.size() == 1) impl->byte_ids[static_cast<uint8_t>(bytes[0])] = rank;
  }
  // tiktoken merges any two adjacent parts whose concatenation is a token, lowest rank first: as
  // pair merges, every split of every token into two tokens, with the whole token's rank.
  for (int32_t rank = 0; rank < num_base; ++rank) {
    const std::string_view bytes = tokens[rank];
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto left = impl->piece_ranks.find(absl_sv(bytes.substr(0, k)));
      if (left == impl->piece_ranks.end()) continue;
      auto right = impl->piece_ranks.find(absl_sv(bytes.substr(k)));
      if (right == impl->piece_ranks.end()) continue;
      impl->merges.emplace(pair_key(left->second, right->second),
                           Merge{static_cast<uint32_t>(rank), rank});
    }
  }
  for (const AddedToken& token : specials) {
    impl->added_vocab.emplace(token.content, token.id);
    impl->added_raw.tokens.push_back(token);
  }
  impl->added_raw.build();
  impl->added_normalized.build();
  impl->finish_ids(num_base + kKimiSpecialSlots, specials);
  // Decoding is tiktoken's: the token's bytes, a special token's UTF-8 text.
  for (int32_t rank = 0; rank < num_base; ++rank) impl->id_bytes[rank] = tokens[rank];
  for (const AddedToken& token : specials) impl->id_bytes[token.id] = token.content;
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::string Tokenizer::format_in_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "tokenizer.json", ec)) return "tokenizer.json";
  if (fs::exists(fs::path(dir) / kModelFile, ec)) return std::string(kModelFile);
  return "";
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string format = format_in_dir(dir);
  if (format.empty())
    return absl::NotFoundError(absl::StrCat(dir, ": no tokenizer.json or ", absl_sv(kModelFile)));
  if (format == "tokenizer.json") return from_file((fs::path(dir) / "tokenizer.json").string());
  const fs::path config_path = fs::path(dir) / kConfigFile;
  std::error_code ec;
  if (!fs::exists(config_path, ec))
    return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": missing (",
                                                   absl_sv(kModelFile), " needs it beside it)"));
  LOOM_ASSIGN_OR_RETURN(const std::string model, read_file(fs::path(dir) / kModelFile));
  LOOM_ASSIGN_OR_RETURN(const std::string config, read_file(config_path));
  auto tokenizer = from_tiktoken(model, config);
  if (!tokenizer.ok())  // the messages start with the file's name: make it the file's path
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat((fs::path(dir) / "").string(), tokenizer.status().message()));
  return tokenizer;
}

}  // namespace loom
