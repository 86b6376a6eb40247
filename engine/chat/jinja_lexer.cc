#include "engine/chat/jinja_lexer.h"

#include <cctype>
#include <cstdint>

#include "engine/chat/jinja_value.h"

namespace loom::jinja {
namespace {

// jinja2 splits the source at "\r\n", "\r" and "\n", drops one trailing newline
// (keep_trailing_newline=False) and joins the lines with "\n".
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

size_t char_len(std::string_view s, size_t i) {
  unsigned char c = s[i];
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  return i + n > s.size() ? 1 : n;
}

// Python's str.rstrip() (Unicode whitespace).
std::string_view rstrip_space(std::string_view s) {
  size_t end = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = char_len(s, i);
    if (!is_py_space(s.substr(i, n))) end = i + n;
    i += n;
  }
  return s.substr(0, end);
}

// Skips Unicode whitespace from `pos` (the `\s*` after `-%}`).
size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t n = char_len(s, pos);
    if (!is_py_space(s.substr(pos, n))) break;
    pos += n;
  }
  return pos;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    size_t n = char_len(s, i);
    if (!is_py_space(s.substr(i, n))) return false;
    i += n;
  }
  return true;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xc0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xe0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(char(0xf0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(char(0x80 | (cp & 0x3f)));
  }
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string decode_escapes(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    auto hex = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k]))) {
          fail("truncated \\" + std::string(1, e) + " escape in a string literal", line);
        }
        v = v * 16 + std::stoul(std::string(1, body[i + k]), nullptr, 16);
      }
      i += n;
      return v;
    };
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\n':
        break;
      case 'x':
        append_utf8(hex(2), &out);
        break;
      case 'u':
        append_utf8(hex(4), &out);
        break;
      case 'U': {
        uint32_t cp = hex(8);
        if (cp > 0x10ffff) fail("\\U escape out of range in a string literal", line);
        append_utf8(cp, &out);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          append_utf8(v, &out);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source_in) {
  const std::string source = normalize_newlines(source_in);
  const std::string_view src = source;
  std::vector<Token> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  while (pos < src.size()) {
    size_t tag = src.find('{', pos);
    while (tag != std::string_view::npos && tag + 1 < src.size() && src[tag + 1] != '{' &&
           src[tag + 1] != '%' && src[tag + 1] != '#') {
      tag = src.find('{', tag + 1);
    }
    if (tag == std::string_view::npos || tag + 1 >= src.size()) {
      out.push_back({Token::Kind::kData, std::string(src.substr(pos)), line});
      break;
    }
    const char type = src[tag + 1];
    const char sign =
        tag + 2 < src.size() && (src[tag + 2] == '-' || src[tag + 2] == '+') ? src[tag + 2] : '\0';
    std::string_view text = src.substr(pos, tag - pos);
    const int text_lines = count_newlines(text);
    if (sign == '-') {
      text = rstrip_space(text);
    } else if (sign != '+' && type != '{') {  // lstrip_blocks: block and comment tags only
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting) && all_space(text.substr(l_pos))) {
        text = text.substr(0, l_pos);
      }
    }
    if (!text.empty()) out.push_back({Token::Kind::kData, std::string(text), line});
    line += text_lines;
    pos = tag + 2 + (sign ? 1 : 0);

    if (type == '#') {
      size_t close = src.find("#}", pos);
      if (close == std::string_view::npos) fail("missing end of comment tag '#}'", line);
      line += count_newlines(src.substr(pos, close - pos));
      const bool minus = close > pos && src[close - 1] == '-';
      const bool plus = close > pos && src[close - 1] == '+';
      size_t end = close + 2;
      if (minus) {
        end = skip_space(src, end);
      } else if (!plus && end < src.size() && src[end] == '\n') {
        ++end;  // trim_blocks
      }
      line += count_newlines(src.substr(close, end - close));
      line_starting = src[end - 1] == '\n';
      pos = end;
      continue;
    }

    const bool block = type == '%';
    const int tag_line = line;
    out.push_back({block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "", line});
    int depth = 0;
    bool closed = false;
    while (pos < src.size()) {
      // End of the tag (not inside brackets, as jinja2's balancing stack).
      if (depth == 0) {
        std::string_view rest = src.substr(pos);
        size_t end = std::string_view::npos;
        if (block) {
          if (rest.starts_with("+%}")) {
            end = pos + 3;
          } else if (rest.starts_with("-%}")) {
            end = skip_space(src, pos + 3);
          } else if (rest.starts_with("%}")) {
            end = pos + 2;
            if (end < src.size() && src[end] == '\n') ++end;  // trim_blocks
          }
        } else {
          if (rest.starts_with("-}}")) {
            end = skip_space(src, pos + 3);
          } else if (rest.starts_with("}}")) {
            end = pos + 2;
          }
        }
        if (end != std::string_view::npos) {
          out.push_back({block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "", line});
          line += count_newlines(src.substr(pos, end - pos));
          line_starting = src[end - 1] == '\n';
          pos = end;
          closed = true;
          break;
        }
      }
      const char c = src[pos];
      const size_t n = char_len(src, pos);
      if (is_py_space(src.substr(pos, n))) {
        line += c == '\n';
        pos += n;
        continue;
      }
      const bool digit = std::isdigit(static_cast<unsigned char>(c));
      if (digit) {
        size_t p = pos;
        std::string num;
        auto digits = [&]() {
          size_t start = p;
          while (p < src.size() && (std::isdigit(static_cast<unsigned char>(src[p])) ||
                                    (src[p] == '_' && p > start && p + 1 < src.size() &&
                                     std::isdigit(static_cast<unsigned char>(src[p + 1]))))) {
            if (src[p] != '_') num.push_back(src[p]);
            ++p;
          }
        };
        digits();
        bool is_float = false;
        const bool after_dot = pos > 0 && src[pos - 1] == '.';
        if (!after_dot && p + 1 < src.size() && src[p] == '.' &&
            std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
          num.push_back('.');
          ++p;
          digits();
          is_float = true;
        }
        if (!after_dot && p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
          size_t q = p + 1;
          if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
          if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
            num += 'e';
            if (src[p + 1] == '-') num += '-';
            p = q;
            digits();
            is_float = true;
          }
        }
        out.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, line});
        pos = p;
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t p = pos;
        while (p < src.size() &&
               (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_')) {
          ++p;
        }
        out.push_back({Token::Kind::kName, std::string(src.substr(pos, p - pos)), line});
        pos = p;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t p = pos + 1;
        while (p < src.size() && src[p] != c) p += src[p] == '\\' ? 2 : 1;
        if (p >= src.size()) fail("unterminated string literal", line);
        std::string body = std::string(src.substr(pos + 1, p - pos - 1));
        out.push_back({Token::Kind::kString, decode_escapes(body, line), line});
        line += count_newlines(body);
        pos = p + 1;
        continue;
      }
      static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                         "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                         ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      bool matched = false;
      for (const char* op : kOps) {
        std::string_view o(op);
        if (src.substr(pos).starts_with(o)) {
          if (o == "(" || o == "[" || o == "{") ++depth;
          if (o == ")" || o == "]" || o == "}") {
            if (depth == 0) fail("unexpected '" + std::string(o) + "'", line);
            --depth;
          }
          out.push_back({Token::Kind::kOp, std::string(o), line});
          pos += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) {
        fail("unexpected character '" + std::string(src.substr(pos, n)) + "' in a tag", line);
      }
    }
    if (!closed) {
      fail(std::string("unclosed ") + (block ? "'{%' block tag" : "'{{' expression tag"), tag_line);
    }
  }
  out.push_back({Token::Kind::kEnd, "", line});
  return out;
}

}  // namespace loom::jinja
