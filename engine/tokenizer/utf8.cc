#include "engine/tokenizer/utf8.h"

#include <utf8proc.h>

namespace loom::tokenizer_internal {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// For a lead byte: the sequence length and the allowed range of the second byte (Unicode Table
// 3-7, well-formed UTF-8 byte sequences). Length 0 marks a byte that can never start a sequence.
struct Lead {
  int len;
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes at s[i] forming a valid prefix of a sequence (>= 1 for a valid lead), and
// whether that prefix is complete.
size_t valid_prefix(std::string_view s, size_t i, bool* complete) {
  const auto b = static_cast<uint8_t>(s[i]);
  const Lead lead = lead_of(b);
  *complete = false;
  if (lead.len == 0) return 0;
  if (lead.len == 1) {
    *complete = true;
    return 1;
  }
  size_t k = 1;
  for (; k < static_cast<size_t>(lead.len); ++k) {
    if (i + k >= s.size()) return k;  // ran out of input: still completable
    const auto c = static_cast<uint8_t>(s[i + k]);
    const uint8_t lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) return k;  // maximal subpart ends here
  }
  *complete = true;
  return k;
}

}  // namespace

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    // Copy runs of ASCII quickly.
    size_t j = i;
    while (j < bytes.size() && static_cast<uint8_t>(bytes[j]) < 0x80) ++j;
    out->append(bytes.data() + i, j - i);
    i = j;
    if (i == bytes.size()) break;
    bool complete = false;
    const size_t n = valid_prefix(bytes, i, &complete);
    if (complete) {
      out->append(bytes.data() + i, n);
      i += n;
    } else if (n > 0 && i + n == bytes.size() && !final) {
      return i;  // an incomplete sequence that more bytes could still complete
    } else {
      out->append(kReplacement);
      i += n == 0 ? 1 : n;
    }
  }
  return i;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete = false;
    const size_t n = valid_prefix(s, i, &complete);
    if (!complete) return false;
    i += n;
  }
  return true;
}

size_t utf8_char_len(std::string_view s, size_t i) {
  bool complete = false;
  const size_t n = valid_prefix(s, i, &complete);
  return complete ? n : 1;
}

int32_t utf8_decode_at(std::string_view s, size_t i, size_t* len) {
  bool complete = false;
  const size_t n = valid_prefix(s, i, &complete);
  if (!complete) {
    *len = 1;
    return -1;
  }
  *len = n;
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (n == 1) return b0;
  int32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

size_t utf8_prev_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  for (int k = 0; k < 3 && i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80; ++k) --i;
  size_t len = 0;
  (void)utf8_decode_at(s, i, &len);
  return i + len == end ? i : end - 1;
}

bool is_white_space(int32_t cp) {
  if (cp < 0) return false;
  if (cp <= 0x7F) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(int32_t cp) {
  if (cp < 0) return false;
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

void append_utf8(int32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace loom::tokenizer_internal
