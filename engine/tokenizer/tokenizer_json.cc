// Loading a HuggingFace tokenizer.json into loom::Tokenizer. Every malformed or unsupported field
// is an InvalidArgument error naming the field; nothing here throws or aborts on bad input.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using json = nlohmann::json;
using namespace tokenizer_internal;  // NOLINT(build/namespaces): .cc-local convenience

// Ids at or above this are rejected: a vocabulary is a few hundred thousand tokens, and ids size
// per-id tables, so a huge id in a hostile file must not allocate gigabytes.
constexpr int64_t kMaxVocabSize = 1 << 24;
constexpr size_t kMaxFileBytes = size_t{1} << 30;

absl::Status invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", field, ": ", what));
}

// Optional boolean (absent or null gives `fallback`).
absl::StatusOr<bool> get_bool(const json& obj, const char* key, const std::string& field,
                              bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid(absl::StrCat(absl_sv(field), ".", key), "not a boolean");
  return it->get<bool>();
}

// Optional string (absent or null gives "").
absl::StatusOr<std::string> get_string(const json& obj, const char* key, const std::string& field) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return invalid(absl::StrCat(absl_sv(field), ".", key), "not a string");
  return it->get<std::string>();
}

absl::StatusOr<int32_t> get_id(const json& value, const std::string& field) {
  if (!value.is_number_integer()) return invalid(field, "id is not an integer");
  const int64_t id =
      value.is_number_unsigned()
          ? static_cast<int64_t>(std::min<uint64_t>(value.get<uint64_t>(), kMaxVocabSize))
          : value.get<int64_t>();
  if (id < 0 || id >= kMaxVocabSize)
    return invalid(field, absl::StrCat("id ", id, " out of range [0, ", kMaxVocabSize, ")"));
  return static_cast<int32_t>(id);
}

absl::StatusOr<std::string> get_type(const json& obj, const std::string& field) {
  if (!obj.is_object()) return invalid(field, "not an object");
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) return invalid(absl::StrCat(field, ".type"), "missing");
  return it->get<std::string>();
}

absl::Status parse_normalizer(const json& node, const std::string& field, Tokenizer::Impl* impl,
                              int depth) {
  if (node.is_null()) return absl::OkStatus();
  if (depth > 8) return invalid(field, "nested too deeply");
  LOOM_ASSIGN_OR_RETURN(const std::string type, get_type(node, field));
  if (type == "NFC") {
    impl->normalizers.push_back(Normalization::kNFC);
  } else if (type == "NFD") {
    impl->normalizers.push_back(Normalization::kNFD);
  } else if (type == "NFKC") {
    impl->normalizers.push_back(Normalization::kNFKC);
  } else if (type == "NFKD") {
    impl->normalizers.push_back(Normalization::kNFKD);
  } else if (type == "Sequence") {
    auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array())
      return invalid(absl::StrCat(field, ".normalizers"), "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i) {
      LOOM_RETURN_IF_ERROR(parse_normalizer((*it)[i], absl::StrCat(field, ".normalizers[", i, "]"),
                                            impl, depth + 1));
    }
  } else {
    return invalid(absl::StrCat(field, ".type"), absl::StrCat("'", type, "' is not supported"));
  }
  return absl::OkStatus();
}

absl::Status parse_pre_tokenizer(const json& node, const std::string& field, Tokenizer::Impl* impl,
                                 int depth) {
  if (node.is_null()) return absl::OkStatus();
  if (depth > 8) return invalid(field, "nested too deeply");
  LOOM_ASSIGN_OR_RETURN(const std::string type, get_type(node, field));
  if (impl->byte_level_input)
    return invalid(field, "steps after ByteLevel are not supported (ByteLevel must be last)");
  PreTokenizerStep step;
  if (type == "Sequence") {
    auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array())
      return invalid(absl::StrCat(field, ".pretokenizers"), "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i) {
      LOOM_RETURN_IF_ERROR(parse_pre_tokenizer(
          (*it)[i], absl::StrCat(field, ".pretokenizers[", i, "]"), impl, depth + 1));
    }
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    LOOM_ASSIGN_OR_RETURN(step.add_prefix_space,
                          get_bool(node, "add_prefix_space", field, /*fallback=*/true));
    LOOM_ASSIGN_OR_RETURN(const bool use_regex,
                          get_bool(node, "use_regex", field, /*fallback=*/true));
    if (use_regex) {
      LOOM_ASSIGN_OR_RETURN(step.regex, Regex::compile(kGpt2Pattern, /*literal=*/false));
    }
    impl->byte_level_input = true;
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object())
      return invalid(absl::StrCat(field, ".pattern"), "missing or not an object");
    const std::string pattern_field = absl::StrCat(field, ".pattern");
    auto regex = pattern->find("Regex");
    auto literal = pattern->find("String");
    if (regex != pattern->end() && regex->is_string()) {
      auto compiled = Regex::compile(regex->get<std::string>(), /*literal=*/false);
      if (!compiled.ok()) return invalid(pattern_field + ".Regex", compiled.status().message());
      step.regex = *std::move(compiled);
    } else if (literal != pattern->end() && literal->is_string()) {
      auto compiled = Regex::compile(literal->get<std::string>(), /*literal=*/true);
      if (!compiled.ok()) return invalid(pattern_field + ".String", compiled.status().message());
      step.regex = *std::move(compiled);
    } else {
      return invalid(pattern_field, "needs a string \"Regex\" or \"String\"");
    }
    LOOM_ASSIGN_OR_RETURN(const std::string behavior, get_string(node, "behavior", field));
    if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return invalid(absl::StrCat(field, ".behavior"),
                     absl::StrCat("'", behavior, "' is not a split behavior"));
    }
    LOOM_ASSIGN_OR_RETURN(step.invert, get_bool(node, "invert", field, false));
  } else {
    return invalid(absl::StrCat(field, ".type"), absl::StrCat("'", type, "' is not supported"));
  }
  impl->pre_tokenizers.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status parse_decoder(const json& node) {
  if (node.is_null())
    return invalid("decoder", "missing (a ByteLevel decoder is required for byte-level BPE)");
  LOOM_ASSIGN_OR_RETURN(const std::string type, get_type(node, "decoder"));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    auto it = node.find("decoders");
    if (it == node.end() || !it->is_array() || it->size() != 1)
      return invalid("decoder.decoders", "only a Sequence of exactly one ByteLevel is supported");
    return parse_decoder((*it)[0]);
  }
  return invalid("decoder.type", absl::StrCat("'", type, "' is not supported"));
}

absl::Status parse_model(const json& model, Tokenizer::Impl* impl, int32_t* max_id) {
  if (!model.is_object()) return invalid("model", "missing or not an object");
  auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && type->get<std::string>() == "BPE"))
    return invalid("model.type", "only BPE is supported");
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() <= 0.0))
    return invalid("model.dropout", "BPE dropout is not supported (must be null)");
  LOOM_ASSIGN_OR_RETURN(impl->fuse_unk, get_bool(model, "fuse_unk", "model", false));
  LOOM_ASSIGN_OR_RETURN(impl->byte_fallback, get_bool(model, "byte_fallback", "model", false));
  LOOM_ASSIGN_OR_RETURN(impl->ignore_merges, get_bool(model, "ignore_merges", "model", false));
  LOOM_ASSIGN_OR_RETURN(impl->continuing_subword_prefix,
                        get_string(model, "continuing_subword_prefix", "model"));
  LOOM_ASSIGN_OR_RETURN(impl->end_of_word_suffix, get_string(model, "end_of_word_suffix", "model"));

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    return invalid("model.vocab", "missing or not an object");
  if (vocab->size() > static_cast<size_t>(kMaxVocabSize))
    return invalid("model.vocab", "too many entries");
  impl->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    LOOM_ASSIGN_OR_RETURN(const int32_t id,
                          get_id(it.value(), absl::StrCat("model.vocab[\"", it.key(), "\"]")));
    impl->vocab.insert_or_assign(it.key(), id);
    *max_id = std::max(*max_id, id);
  }

  LOOM_ASSIGN_OR_RETURN(const std::string unk, get_string(model, "unk_token", "model"));
  if (!unk.empty()) {
    auto it = impl->vocab.find(unk);
    if (it == impl->vocab.end()) return invalid("model.unk_token", "not in model.vocab");
    impl->unk_id = it->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    return invalid("model.merges", "missing or not an array");
  if (merges->size() > static_cast<size_t>(kMaxVocabSize))
    return invalid("model.merges", "too many entries");
  impl->merges.reserve(merges->size());
  const size_t prefix_len = impl->continuing_subword_prefix.size();
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    std::string a, b;
    if (m.is_string()) {  // legacy "a b"
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        return invalid(field, "expected two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return invalid(field, "expected a pair of token strings");
    }
    auto ia = impl->vocab.find(a), ib = impl->vocab.find(b);
    if (ia == impl->vocab.end())
      return invalid(field, absl::StrCat("token '", a, "' is not in model.vocab"));
    if (ib == impl->vocab.end())
      return invalid(field, absl::StrCat("token '", b, "' is not in model.vocab"));
    if (b.size() < prefix_len || b.compare(0, prefix_len, impl->continuing_subword_prefix) != 0) {
      if (prefix_len > 0) return invalid(field, "second token lacks the continuing_subword_prefix");
    }
    const std::string merged = a + b.substr(prefix_len);
    auto in = impl->vocab.find(merged);
    if (in == impl->vocab.end())
      return invalid(field, absl::StrCat("merged token '", merged, "' is not in model.vocab"));
    // A repeated pair keeps its last rank, as HuggingFace's map construction does.
    impl->merges.insert_or_assign(pair_key(ia->second, ib->second),
                                  Merge{static_cast<uint32_t>(i), in->second});
  }
  return absl::OkStatus();
}

absl::Status parse_added_tokens(const json& root, Tokenizer::Impl* impl, int32_t* max_id,
                                std::vector<AddedToken>* all) {
  auto node = root.find("added_tokens");
  if (node == root.end() || node->is_null()) return absl::OkStatus();
  if (!node->is_array()) return invalid("added_tokens", "not an array");
  for (size_t i = 0; i < node->size(); ++i) {
    const json& t = (*node)[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) return invalid(field, "not an object");
    AddedToken token;
    auto id = t.find("id");
    if (id == t.end()) return invalid(field + ".id", "missing");
    LOOM_ASSIGN_OR_RETURN(token.id, get_id(*id, field + ".id"));
    auto content = t.find("content");
    if (content == t.end() || !content->is_string() ||
        content->get_ref<const std::string&>().empty())
      return invalid(field + ".content", "missing or not a non-empty string");
    token.content = content->get<std::string>();
    LOOM_ASSIGN_OR_RETURN(token.special, get_bool(t, "special", field, false));
    LOOM_ASSIGN_OR_RETURN(token.single_word, get_bool(t, "single_word", field, false));
    LOOM_ASSIGN_OR_RETURN(token.lstrip, get_bool(t, "lstrip", field, false));
    LOOM_ASSIGN_OR_RETURN(token.rstrip, get_bool(t, "rstrip", field, false));
    // HuggingFace's default: normalized unless special.
    LOOM_ASSIGN_OR_RETURN(token.normalized, get_bool(t, "normalized", field, !token.special));
    impl->added_vocab.insert_or_assign(token.content, token.id);
    *max_id = std::max(*max_id, token.id);
    all->push_back(token);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view json_text) {
  if (json_text.size() > kMaxFileBytes) return invalid("(file)", "larger than 1 GiB");
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid("(file)", "not valid JSON");
  if (!root.is_object()) return invalid("(file)", "top level is not an object");

  auto impl = std::make_unique<Impl>();
  int32_t max_id = -1;
  auto model = root.find("model");
  if (model == root.end()) return invalid("model", "missing");
  LOOM_RETURN_IF_ERROR(parse_model(*model, impl.get(), &max_id));
  std::vector<AddedToken> added;
  LOOM_RETURN_IF_ERROR(parse_added_tokens(root, impl.get(), &max_id, &added));
  auto normalizer = root.find("normalizer");
  if (normalizer != root.end())
    LOOM_RETURN_IF_ERROR(parse_normalizer(*normalizer, "normalizer", impl.get(), 0));
  auto pre_tokenizer = root.find("pre_tokenizer");
  if (pre_tokenizer != root.end())
    LOOM_RETURN_IF_ERROR(parse_pre_tokenizer(*pre_tokenizer, "pre_tokenizer", impl.get(), 0));
  auto decoder = root.find("decoder");
  LOOM_RETURN_IF_ERROR(parse_decoder(decoder == root.end() ? json() : *decoder));
  if (max_id < 0) return invalid("model.vocab", "empty");

  for (int b = 0; b < 256; ++b) {
    auto it = impl->vocab.find(byte_to_char(static_cast<uint8_t>(b)));
    impl->byte_ids[b] = it == impl->vocab.end() ? -1 : it->second;
  }
  for (const AddedToken& token : added) {
    AddedToken matched = token;  // normalized tokens are matched in their normalized form
    if (token.normalized && !impl->normalizers.empty())
      matched.content = impl->normalize(token.content);
    (token.normalized ? impl->added_normalized : impl->added_raw).tokens.push_back(matched);
  }
  impl->added_raw.build();
  impl->added_normalized.build();
  impl->finish_ids(max_id + 1, added);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  auto tokenizer = from_json(buffer.str());
  if (!tokenizer.ok())
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  return tokenizer;
}

}  // namespace loom
