// Encoding, decoding and streaming for loom::Tokenizer; loading is in tokenizer_json.cc.
#include "engine/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/tokenizer/tiktoken.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "engine/tokenizer/utf8.h"

namespace loom {
namespace tokenizer_internal {

// ------------------------------------------------------------------------------------------------
// Regex (PCRE2)

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;  // JIT-compiled: match through pcre2_jit_match (skips the generic entry)
};

namespace {

// Per-thread PCRE2 scratch: match data (enough pairs for any pattern's ovector[0..1]) and a JIT
// stack that may grow to kJitStackMax (long whitespace runs backtrack through it).
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 8 * 1024 * 1024;

struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(32, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern,
                                                            bool literal) {
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex error at offset ", offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // Without JIT (unsupported platform) the interpreter is used.
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  auto* holder = new Code{code, jit};
  return std::shared_ptr<const Regex>(new Regex(holder));
}

Regex::~Regex() {
  pcre2_code_free(code_->code);
  delete code_;
}

bool Regex::find(std::string_view subject, size_t start, size_t* begin, size_t* end) const {
  if (start > subject.size()) return false;
  MatchScratch& scratch = match_scratch();
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = code_->jit ? pcre2_jit_match(code_->code, text, subject.size(), start, 0, scratch.data,
                                        scratch.context)
                      : PCRE2_ERROR_NOMATCH;
  if (!code_->jit || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) {
    // The interpreter, also the fallback when the JIT stack runs out.
    rc = pcre2_match(code_->code, text, subject.size(), start, 0, scratch.data, scratch.context);
  }
  if (rc < 0) return false;  // no match, or a resource limit: the rest stays one piece
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  if (ovector[0] > ovector[1] || ovector[1] > subject.size()) return false;  // \K oddities
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

// ------------------------------------------------------------------------------------------------
// Byte <-> character map of GPT-2's byte-level BPE.

namespace {

struct ByteMap {
  std::array<int32_t, 256> char_of{};
  std::array<std::string, 256> utf8_of;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      char_of[b] = printable ? b : 256 + n++;
      append_utf8(char_of[b], &utf8_of[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap* map = new ByteMap();
  return *map;
}

}  // namespace

std::string byte_to_char(uint8_t b) { return byte_map().utf8_of[b]; }

int byte_of_char(int32_t cp) {
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return cp;
  if (cp >= 256 && cp < 256 + 68) {
    const ByteMap& map = byte_map();
    for (int b = 0; b < 256; ++b)
      if (map.char_of[b] == cp) return b;
  }
  return -1;
}

bool SpecialPolicy::allows(size_t begin, size_t end) const {
  if (all) return true;
  // The last range starting at or before `begin` is the only one that can contain the match.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), begin,
                             [](size_t v, const Tokenizer::Range& r) { return v < r.begin; });
  if (it == ranges.begin()) return false;
  --it;
  return end <= it->end;
}

size_t SpecialPolicy::disallowed_until(size_t pos, size_t limit) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), pos,
                             [](size_t v, const Tokenizer::Range& r) { return v < r.begin; });
  return it == ranges.end() ? limit : std::min(limit, it->begin);
}

SpecialPolicy SpecialPolicy::slice(size_t begin, size_t end) const {
  SpecialPolicy out;
  out.all = all;
  for (const Tokenizer::Range& r : ranges) {
    const size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
    if (b < e) out.ranges.push_back({b - begin, e - begin});
  }
  return out;
}

void AddedMatcher::build() {
  for (auto& bucket : by_first_byte) bucket.clear();
  for (uint32_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].content.empty()) continue;
    by_first_byte[static_cast<uint8_t>(tokens[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return tokens[a].content.size() > tokens[b].content.size();
    });
  }
}

namespace {

// One stretch of input: an added token (id >= 0) or text to encode further (id == -1).
struct Segment {
  int32_t id;
  size_t begin, end;
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len = 0;
  return is_word_char(utf8_decode_at(s, utf8_prev_start(s, s.size()), &len));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len = 0;
  return is_word_char(utf8_decode_at(s, 0, &len));
}

// HuggingFace AddedVocabulary::find_matches: leftmost-longest matches, then the single_word,
// lstrip and rstrip rules.
std::vector<Segment> split_added(std::string_view text, const AddedMatcher& matcher,
                                 const SpecialPolicy& special) {
  std::vector<Segment> out;
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = matcher.by_first_byte[static_cast<uint8_t>(text[pos])];
    const AddedToken* hit = nullptr;
    for (uint32_t index : bucket) {
      const AddedToken& token = matcher.tokens[index];
      if (token.content.size() <= text.size() - pos &&
          std::memcmp(text.data() + pos, token.content.data(), token.content.size()) == 0) {
        hit = &token;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->content.size();
    pos = stop;
    if (hit->special && !special.allows(start, stop)) {
      pos = std::min(stop, special.disallowed_until(start, stop));
      continue;
    }
    if (hit->single_word &&
        (ends_with_word(text.substr(0, start)) || starts_with_word(text.substr(stop))))
      continue;
    if (hit->lstrip) {
      size_t s = start;
      while (s > start_offset) {
        const size_t prev = utf8_prev_start(text, s);
        size_t len = 0;
        if (!is_white_space(utf8_decode_at(text, prev, &len))) break;
        s = prev;
      }
      start = s;
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        size_t len = 0;
        if (!is_white_space(utf8_decode_at(text, stop, &len))) break;
        stop += len;
      }
      pos = stop;
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({hit->id, start, stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({-1, start_offset, text.size()});
  return out;
}

// Pieces of a pre-tokenized string: views into the input or into `arena` (prefix-space copies).
struct Pieces {
  std::vector<std::string_view> views;
  std::vector<std::unique_ptr<std::string>> arena;
};

// HuggingFace NormalizedString::split with a regex pattern and a behavior.
void split_piece(std::string_view piece, const Regex& regex, SplitBehavior behavior, bool invert,
                 std::vector<std::string_view>* out) {
  size_t prev = 0, search = 0, begin = 0, end = 0;
  if (behavior == SplitBehavior::kIsolated) {  // the common case, without intermediate lists
    while (search <= piece.size() && regex.find(piece, search, &begin, &end)) {
      if (begin == end) {
        if (begin >= piece.size()) break;
        search = begin + utf8_char_len(piece, begin);
        continue;
      }
      if (prev != begin) out->push_back(piece.substr(prev, begin - prev));
      out->push_back(piece.substr(begin, end - begin));
      prev = search = end;
    }
    if (prev != piece.size()) out->push_back(piece.substr(prev));
    return;
  }
  struct Range {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Range> ranges;
  while (search <= piece.size() && regex.find(piece, search, &begin, &end)) {
    if (begin == end) {  // empty match: contributes nothing, step one character
      if (begin >= piece.size()) break;
      search = begin + utf8_char_len(piece, begin);
      continue;
    }
    if (prev != begin) ranges.push_back({prev, begin, invert});
    ranges.push_back({begin, end, !invert});
    prev = search = end;
  }
  if (prev != piece.size()) ranges.push_back({prev, piece.size(), invert});

  std::vector<std::pair<size_t, size_t>> splits;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges)
        if (!r.is_match) splits.emplace_back(r.begin, r.end);
      break;
    case SplitBehavior::kIsolated:
      for (const Range& r : ranges) splits.emplace_back(r.begin, r.end);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.is_match && !previous_match && !splits.empty())
          splits.back().second = r.end;
        else
          splits.emplace_back(r.begin, r.end);
        previous_match = r.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty())
          splits.back().first = it->begin;
        else
          splits.emplace_back(it->begin, it->end);
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Range& r : ranges) {
        if (r.is_match == previous_match && !splits.empty())
          splits.back().second = r.end;
        else
          splits.emplace_back(r.begin, r.end);
        previous_match = r.is_match;
      }
      break;
  }
  for (const auto& [b, e] : splits)
    if (e > b) out->push_back(piece.substr(b, e - b));
}

void pre_tokenize(std::string_view text, const std::vector<PreTokenizerStep>& steps,
                  Pieces* pieces) {
  pieces->views.assign(1, text);
  std::vector<std::string_view> next;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (std::string_view piece : pieces->views) {
      if (step.kind == PreTokenizerStep::Kind::kByteLevel && step.add_prefix_space &&
          (piece.empty() || piece[0] != ' ')) {
        pieces->arena.push_back(std::make_unique<std::string>(absl::StrCat(" ", absl_sv(piece))));
        piece = *pieces->arena.back();
      }
      if (step.regex == nullptr) {
        if (!piece.empty()) next.push_back(piece);
        continue;
      }
      split_piece(piece, *step.regex, step.behavior, step.invert, &next);
    }
    pieces->views.swap(next);
  }
}

}  // namespace
}  // namespace tokenizer_internal

// ------------------------------------------------------------------------------------------------
// Tokenizer::Impl

using namespace tokenizer_internal;  // NOLINT(build/namespaces): .cc-local convenience

std::string Tokenizer::Impl::normalize(std::string_view text) const {
  std::string current(text);
  if (normalizers.empty()) return current;
  if (std::all_of(current.begin(), current.end(),
                  [](char c) { return static_cast<uint8_t>(c) < 0x80; }))
    return current;  // ASCII is invariant under every Unicode normalization form
  if (!is_valid_utf8(current)) {
    std::string repaired;
    append_utf8_lossy(current, /*final=*/true, &repaired);
    current.swap(repaired);
  }
  for (Normalization form : normalizers) {
    int options = UTF8PROC_STABLE;
    switch (form) {
      case Normalization::kNFC:
        options |= UTF8PROC_COMPOSE;
        break;
      case Normalization::kNFD:
        options |= UTF8PROC_DECOMPOSE;
        break;
      case Normalization::kNFKC:
        options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
      case Normalization::kNFKD:
        options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(current.data()),
                     static_cast<utf8proc_ssize_t>(current.size()), &result,
                     static_cast<utf8proc_option_t>(options));
    if (n >= 0) current.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);  // utf8proc allocates with malloc; on error the text stays as it was
  }
  return current;
}

void Tokenizer::Impl::encode_all(std::string_view text, const SpecialPolicy& special,
                                 std::vector<int32_t>* out) const {
  // A text of at most kKimiMaxRunChars bytes has no longer run: one chunk.
  if (!tiktoken || text.size() <= kKimiMaxRunChars) {
    encode_text(text, special, out);
    return;
  }
  std::vector<Range> chunks;
  kimi_chunks(text, kKimiMaxEncodeChars, kKimiMaxRunChars, &chunks);
  for (const Range& r : chunks)
    encode_text(text.substr(r.begin, r.end - r.begin), special.slice(r.begin, r.end), out);
}

void Tokenizer::Impl::encode_text(std::string_view text, const SpecialPolicy& special,
                                  std::vector<int32_t>* out) const {
  for (const Segment& seg : split_added(text, added_raw, special)) {
    if (seg.id >= 0) {
      out->push_back(seg.id);
      continue;
    }
    const std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    const SpecialPolicy sub = special.slice(seg.begin, seg.end);
    if (normalizers.empty()) {
      encode_normalized(piece, sub, out);
    } else if (sub.all || sub.ranges.empty()) {
      encode_normalized(normalize(piece), sub, out);
    } else {
      // Normalization moves offsets: normalize the parts on either side of each range boundary
      // separately, so the ranges can be carried over to the normalized text exactly.
      std::string normalized;
      SpecialPolicy mapped;
      size_t cursor = 0;
      for (const Range& r : sub.ranges) {
        if (r.begin > cursor) normalized += normalize(piece.substr(cursor, r.begin - cursor));
        const size_t begin = normalized.size();
        normalized += normalize(piece.substr(r.begin, r.end - r.begin));
        mapped.ranges.push_back({begin, normalized.size()});
        cursor = r.end;
      }
      if (cursor < piece.size()) normalized += normalize(piece.substr(cursor));
      encode_normalized(normalized, mapped, out);
    }
  }
}

void Tokenizer::Impl::encode_normalized(std::string_view text, const SpecialPolicy& special,
                                        std::vector<int32_t>* out) const {
  for (const Segment& seg : split_added(text, added_normalized, special)) {
    if (seg.id >= 0) {
      out->push_back(seg.id);
      continue;
    }
    Pieces pieces;
    pre_tokenize(text.substr(seg.begin, seg.end - seg.begin), pre_tokenizers, &pieces);
    for (std::string_view word : pieces.views) encode_word(word, out);
  }
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  // Plain byte tokenizers (no merges) skip the merge loop and the cache entirely.
  if (merges.empty() && byte_level_input && all_bytes_in_vocab &&
      continuing_subword_prefix.empty() && end_of_word_suffix.empty()) {
    for (char c : word) out->push_back(byte_ids[static_cast<uint8_t>(c)]);
    return;
  }
  if (tiktoken) {  // tiktoken takes a piece that is a token as it is
    auto it = piece_ranks.find(absl_sv(word));
    if (it != piece_ranks.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mu);
    auto it = cache.find(absl_sv(word));
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  bpe_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
    std::unique_lock lock(cache_mu);
    if (cache.size() >= kCacheMaxWords) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev, next;
  bool alive;
};

struct Candidate {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
  // Heap order: the lowest rank, then the leftmost position, comes out first.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// Per-thread buffers of bpe_word, so the merge loop allocates nothing in the steady state.
struct BpeScratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
  std::vector<std::pair<size_t, size_t>> chars;
  std::string key;
};

}  // namespace

// HuggingFace BPE::merge_word + Word::merge_all: initial symbols per character, then merges by
// (lowest rank, leftmost position) from a priority queue, skipping stale entries.
void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>* out) const {
  thread_local BpeScratch scratch;
  std::vector<Symbol>& symbols = scratch.symbols;
  symbols.clear();
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };

  const bool affixes = !continuing_subword_prefix.empty() || !end_of_word_suffix.empty();
  const bool fast_bytes = byte_level_input && all_bytes_in_vocab && !affixes && !ignore_merges;
  if (fast_bytes) {
    // Every byte's character is in the vocabulary: one symbol per byte, no lookups.
    for (char c : word) add(byte_ids[static_cast<uint8_t>(c)]);
  } else {
    // Characters as the model sees them: GPT-2 characters of each byte, or UTF-8 characters.
    std::string& mapped = scratch.mapped;
    auto& chars = scratch.chars;  // (begin, length) in `source`
    mapped.clear();
    chars.clear();
    std::string_view source = word;
    if (byte_level_input) {
      for (char c : word) {
        const std::string& ch = byte_map().utf8_of[static_cast<uint8_t>(c)];
        chars.emplace_back(mapped.size(), ch.size());
        mapped += ch;
      }
      source = mapped;
    } else {
      for (size_t i = 0; i < word.size();) {
        const size_t len = utf8_char_len(word, i);
        chars.emplace_back(i, len);
        i += len;
      }
    }

    if (ignore_merges) {
      auto it = vocab.find(absl_sv(source));
      if (it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }

    int32_t pending_unk = -1;  // HF keeps at most one pending unk for fuse_unk
    std::string& key = scratch.key;
    for (size_t c = 0; c < chars.size(); ++c) {
      const std::string_view ch = source.substr(chars[c].first, chars[c].second);
      int32_t id = -1;
      if (byte_level_input && !affixes) {
        id = byte_ids[static_cast<uint8_t>(word[c])];
      } else {
        key.clear();
        if (c > 0) key += continuing_subword_prefix;
        key.append(ch.data(), ch.size());
        if (c + 1 == chars.size()) key += end_of_word_suffix;
        auto it = vocab.find(key);
        if (it != vocab.end()) id = it->second;
      }
      if (id >= 0) {
        if (pending_unk >= 0) add(pending_unk);
        pending_unk = -1;
        add(id);
        continue;
      }
      if (byte_fallback) {
        std::vector<int32_t> byte_tokens;
        for (char b : ch) {
          auto it = vocab.find(absl::StrFormat("<0x%02X>", static_cast<uint8_t>(b)));
          if (it == vocab.end()) break;
          byte_tokens.push_back(it->second);
        }
        if (byte_tokens.size() == ch.size()) {
          for (int32_t t : byte_tokens) add(t);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
        pending_unk = unk_id;
      }
    }
    if (pending_unk >= 0) add(pending_unk);
  }

  std::vector<Candidate>& heap = scratch.heap;
  heap.clear();
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const int32_t right_pos = left.next;
    auto it = merges.find(pair_key(left.id, symbols[right_pos].id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    symbols[right_pos].alive = false;
    left.next = symbols[right_pos].next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& sym : symbols)
    if (sym.alive) out->push_back(sym.id);
}

void Tokenizer::Impl::finish_ids(int32_t size, const std::vector<AddedToken>& all_added) {
  all_bytes_in_vocab =
      std::all_of(byte_ids.begin(), byte_ids.end(), [](int32_t id) { return id >= 0; });
  id_to_token.assign(size, std::string());
  id_state.assign(size, 0);
  for (const auto& [token, id] : vocab) {
    id_to_token[id] = token;
    id_state[id] = 1;
  }
  for (const AddedToken& t : all_added) {
    id_to_token[t.id] = t.content;  // an added token wins over a model token with its id
    id_state[t.id] = t.special ? 2 : 1;
  }
  // The ByteLevel decoder: a token whose every character stands for a byte becomes those bytes;
  // any other token (e.g. most added tokens) is kept as its UTF-8 spelling.
  id_bytes.assign(size, std::string());
  for (int32_t id = 0; id < size; ++id) {
    const std::string& token = id_to_token[id];
    std::string bytes;
    bool all_bytes = true;
    for (size_t i = 0; i < token.size();) {
      size_t len = 0;
      const int b = byte_of_char(utf8_decode_at(token, i, &len));
      if (b < 0) {
        all_bytes = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
      i += len;
    }
    id_bytes[id] = all_bytes ? std::move(bytes) : token;
  }
}

// ------------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::byte_level() {
  auto impl = std::make_unique<Impl>();
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  impl->pre_tokenizers.push_back(step);
  impl->byte_level_input = true;
  for (int b = 0; b < 256; ++b) {
    impl->vocab.emplace(byte_to_char(static_cast<uint8_t>(b)), b);
    impl->byte_ids[b] = b;
  }
  std::vector<AddedToken> added;
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_call|>"};
  for (int i = 0; i < 4; ++i) {
    AddedToken t;
    t.content = specials[i];
    t.id = 256 + i;
    t.special = true;
    impl->added_vocab.emplace(t.content, t.id);
    added.push_back(t);
  }
  impl->added_raw.tokens = added;
  impl->added_raw.build();
  impl->added_normalized.build();
  impl->finish_ids(260, added);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_all(text, allow_special ? SpecialPolicy::everywhere() : SpecialPolicy::nowhere(),
                    &ids);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_special_ranges(
    std::string_view text, std::span<const Range> special_ranges) const {
  SpecialPolicy special;
  for (const Range& r : special_ranges) {
    const size_t end = std::min(r.end, text.size());
    if (r.begin >= end) continue;
    // Sorted and non-overlapping is the contract; merging touching ranges keeps a token that
    // spans two adjacent template pieces matchable.
    if (!special.ranges.empty() && r.begin <= special.ranges.back().end) {
      special.ranges.back().end = std::max(special.ranges.back().end, end);
    } else {
      special.ranges.push_back({r.begin, end});
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_all(text, special, &ids);
  return ids;
}

absl::StatusOr<std::string> Tokenizer::decode(std::span<const int32_t> ids,
                                              bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || impl_->id_state[id] == 0)
      return absl::InvalidArgumentError(absl::StrCat("decode: unknown token id ", id));
    if (skip_special && impl_->id_state[id] == 2) continue;
    bytes += impl_->id_bytes[id];
  }
  std::string text;
  text.reserve(bytes.size());
  append_utf8_lossy(bytes, /*final=*/true, &text);
  return text;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_state.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto added = impl_->added_vocab.find(absl_sv(token));
  if (added != impl_->added_vocab.end()) return added->second;
  auto it = impl_->vocab.find(absl_sv(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_state[id] == 2;
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || impl_->id_state[id] == 0) return std::nullopt;
  return impl_->id_bytes[id];
}

// ------------------------------------------------------------------------------------------------
// StreamingDetokenizer

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

absl::StatusOr<std::string> StreamingDetokenizer::push(int32_t id) {
  const std::optional<std::string_view> bytes = tokenizer_.token_bytes(id);
  if (!bytes) return absl::InvalidArgumentError(absl::StrCat("decode: unknown token id ", id));
  std::string delta;
  if (skip_special_ && tokenizer_.is_special(id)) return delta;
  pending_.append(bytes->data(), bytes->size());
  const size_t consumed = append_utf8_lossy(pending_, /*final=*/false, &delta);
  pending_.erase(0, consumed);
  return delta;
}

std::string StreamingDetokenizer::finish() {
  std::string delta;
  append_utf8_lossy(pending_, /*final=*/true, &delta);
  pending_.clear();
  return delta;
}

}  // namespace loom
