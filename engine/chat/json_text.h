// Internal: JSON text exactly as the Hugging Face templates' `tojson` filter writes it (Python's
// json.dumps with ensure_ascii=False and key order preserved).
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace loom::chat_internal {

enum class JsonSeparators {
  kPython,   // ", " and ": " (json.dumps default; `tool | tojson`)
  kCompact,  // "," and ":" (`tojson(separators=(',', ':'))`)
};

// Appends `s` as a JSON string literal, escaped as Python's json.dumps(ensure_ascii=False) does.
void dump_json_string(const std::string& s, std::string* out);

// Appends `value` to `out`. Strings keep non-ASCII UTF-8 as is and escape like Python.
void dump_json_text(const nlohmann::ordered_json& value, JsonSeparators separators,
                    std::string* out);

}  // namespace loom::chat_internal
