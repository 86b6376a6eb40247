// Lexer of Loom's Jinja interpreter: template source -> tokens, with jinja2's whitespace handling
// as Hugging Face configures it (trim_blocks, lstrip_blocks, keep_trailing_newline off, "\r\n" and
// "\r" read as "\n", `{%-`/`-%}` stripping, `{%+` keeping). Comments are dropped here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::jinja {

struct Token {
  enum class Kind {
    kData,        // template text (value: the text, already whitespace-controlled)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifier (value)
    kString,      // string literal (value: decoded)
    kInt,         // integer literal (value: digits, '_' removed)
    kFloat,       // float literal (value: text, '_' removed)
    kOp,          // operator or punctuation (value)
    kEnd,         // end of source
  };
  Kind kind;
  std::string value;
  int line;
};

// Throws jinja::Error (with the line) on an unterminated tag, comment or string or an unknown
// character.
std::vector<Token> tokenize(std::string_view source);

}  // namespace loom::jinja
