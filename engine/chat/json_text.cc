#include "engine/chat/json_text.h"

#include <cstdio>

namespace loom::chat_internal {

void dump_json_string(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void dump_json_text(const nlohmann::ordered_json& value, JsonSeparators separators,
                    std::string* out) {
  const char* item_sep = separators == JsonSeparators::kPython ? ", " : ",";
  const char* key_sep = separators == JsonSeparators::kPython ? ": " : ":";
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) *out += item_sep;
        first = false;
        dump_json_string(key, out);
        *out += key_sep;
        dump_json_text(item, separators, out);
      }
      out->push_back('}');
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : value) {
        if (!first) *out += item_sep;
        first = false;
        dump_json_text(item, separators, out);
      }
      out->push_back(']');
      return;
    }
    case nlohmann::ordered_json::value_t::string:
      dump_json_string(value.get_ref<const std::string&>(), out);
      return;
    case nlohmann::ordered_json::value_t::boolean:
      *out += value.get<bool>() ? "true" : "false";
      return;
    case nlohmann::ordered_json::value_t::null:
      *out += "null";
      return;
    default:  // numbers: nlohmann writes integers exactly and floats shortest-round-trip
      *out += value.dump();
      return;
  }
}

}  // namespace loom::chat_internal
