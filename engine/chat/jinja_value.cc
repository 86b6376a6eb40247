#include "engine/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/chat/json_text.h"

namespace loom::jinja {

void fail(std::string message, int line) { throw Error{std::move(message), line}; }

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
  } else {
    items.emplace_back(std::move(key), std::move(value));
  }
}

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::real(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::make_list(List items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = tuple;
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::make_namespace(Dict d) {
  Value v = make_dict(std::move(d));
  v.kind = Kind::kNamespace;
  return v;
}
Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(fn));
  v.fn_name = std::move(name);
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0;
    case Kind::kString:
      return !s.empty();
    case Kind::kList:
      return !list->empty();
    case Kind::kDict:
      return !dict->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

Value CallArgs::get(size_t index, std::string_view name, Value fallback) const {
  if (index < args.size()) return args[index];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  return fallback;
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind == K::kFloat || b.kind == K::kFloat) {
      auto as_f = [](const Value& v) {
        return v.kind == K::kFloat ? v.f : v.kind == K::kInt ? double(v.i) : double(v.b);
      };
      return as_f(a) == as_f(b);
    }
    auto as_i = [](const Value& v) { return v.kind == K::kInt ? v.i : int64_t(v.b); };
    return as_i(a) == as_i(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.s == b.s;
    case K::kList:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    case K::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (o == nullptr || !equals(v, *o)) return false;
      }
      return true;
    default:
      return a.dict == b.dict && a.fn == b.fn;
  }
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e+17"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e_pos = sci.find('e');
  std::string mant = sci.substr(0, e_pos);
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (int_part.size() < size_t(exp + 1)) int_part.push_back('0');
      std::string frac = digits.size() > size_t(exp + 1) ? digits.substr(exp + 1) : "";
      out = int_part + "." + (frac.empty() ? "0" : frac);
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + ebuf;
}

namespace {

uint32_t decode_cp(std::string_view ch) {
  auto u = [&](size_t k) { return uint32_t(static_cast<unsigned char>(ch[k])); };
  if (ch.size() == 1) return u(0);
  if (ch.size() == 2) return ((u(0) & 0x1f) << 6) | (u(1) & 0x3f);
  if (ch.size() == 3) return ((u(0) & 0x0f) << 12) | ((u(1) & 0x3f) << 6) | (u(2) & 0x3f);
  return ((u(0) & 0x07) << 18) | ((u(1) & 0x3f) << 12) | ((u(2) & 0x3f) << 6) | (u(3) & 0x3f);
}

std::string repr_string(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (std::string_view ch : utf8_chars(s)) {
    uint32_t cp = decode_cp(ch);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == uint32_t(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0) || cp == 0xad) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      out += buf;
    } else if (cp == 0x2028 || cp == 0x2029) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

struct JsonStyle {
  bool indented = false;
  std::string indent;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys = false;
};

void dump(const Value& v, const JsonStyle& st, int level, std::string* out) {
  using K = Value::Kind;
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int k = 0; k < lvl; ++k) *out += st.indent;
  };
  switch (v.kind) {
    case K::kNone:
      *out += "null";
      return;
    case K::kBool:
      *out += v.b ? "true" : "false";
      return;
    case K::kInt:
      *out += std::to_string(v.i);
      return;
    case K::kFloat:
      if (std::isnan(v.f)) {
        *out += "NaN";
      } else if (std::isinf(v.f)) {
        *out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += float_repr(v.f);
      }
      return;
    case K::kString:
      chat_internal::dump_json_string(v.s, out);
      return;
    case K::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      bool first = true;
      for (const Value& item : *v.list) {
        if (!first) *out += st.item_sep;
        first = false;
        if (st.indented) newline(level + 1);
        dump(item, st, level + 1, out);
      }
      if (st.indented) newline(level);
      out->push_back(']');
      return;
    }
    case K::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto* kv : items) {
        if (!first) *out += st.item_sep;
        first = false;
        if (st.indented) newline(level + 1);
        chat_internal::dump_json_string(kv->first, out);
        *out += st.key_sep;
        dump(kv->second, st, level + 1, out);
      }
      if (st.indented) newline(level);
      out->push_back('}');
      return;
    }
    default:
      fail("tojson: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_py_space(std::string_view ch) {
  uint32_t cp = decode_cp(ch);
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::string to_repr(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::kString:
      return repr_string(v.s);
    case K::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      return out;
    }
    case K::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(item);
      }
      return out + "}";
    }
    case K::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, item] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(item);
      }
      return out + "}>";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::kUndefined:
      return "";
    case K::kNone:
      return "None";
    case K::kBool:
      return v.b ? "True" : "False";
    case K::kInt:
      return std::to_string(v.i);
    case K::kFloat:
      return float_repr(v.f);
    case K::kString:
      return v.s;
    case K::kFunction:
      return "<function " + v.fn_name + ">";
    default:
      return to_repr(v);
  }
}

std::string to_json(const Value& v, const Value& indent, const Value& separators, bool sort_keys) {
  JsonStyle st;
  st.sort_keys = sort_keys;
  if (indent.kind == Value::Kind::kInt) {
    st.indented = true;
    st.indent = std::string(std::max<int64_t>(indent.i, 0), ' ');
  } else if (indent.is_string()) {
    st.indented = true;
    st.indent = indent.s;
  } else if (!indent.is_none() && !indent.is_undefined()) {
    fail("tojson: indent must be an int, a string or None, not " + indent.type_name());
  }
  st.item_sep = st.indented ? "," : ", ";
  st.key_sep = ": ";
  if (separators.is_list()) {
    if (separators.list->size() != 2 || !(*separators.list)[0].is_string() ||
        !(*separators.list)[1].is_string()) {
      fail("tojson: separators must be a pair of strings");
    }
    st.item_sep = (*separators.list)[0].s;
    st.key_sep = (*separators.list)[1].s;
  } else if (!separators.is_none() && !separators.is_undefined()) {
    fail("tojson: separators must be a pair of strings, not " + separators.type_name());
  }
  std::string out;
  dump(v, st, 0, &out);
  return out;
}

namespace {
const Ranges kNoRanges;
}  // namespace

Value tracked_string(std::string s, Ranges ranges) {
  Ranges merged;
  for (const auto& r : ranges) {
    if (r.first >= r.second) continue;
    if (!merged.empty() && merged.back().second >= r.first) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  Value v = Value::string(std::move(s));
  if (!merged.empty()) v.req = std::make_shared<const Ranges>(std::move(merged));
  return v;
}

const Ranges& request_ranges(const Value& v) {
  return v.kind == Value::Kind::kString && v.req ? *v.req : kNoRanges;
}

bool has_request_text(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return v.req != nullptr;
    case Value::Kind::kList:
      for (const Value& x : *v.list) {
        if (has_request_text(x)) return true;
      }
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (v.dict->keys_from_request && !v.dict->items.empty()) return true;
      for (const auto& kv : v.dict->items) {
        if (has_request_text(kv.second)) return true;
      }
      return false;
    default:
      return false;
  }
}

Value mark_request(const Value& v) {
  if (v.kind == Value::Kind::kString) {
    if (v.req || v.s.empty()) return v;
    Value out = v;
    out.req = std::make_shared<const Ranges>(Ranges{{0, v.s.size()}});
    return out;
  }
  if (v.kind == Value::Kind::kList) {
    List items;
    items.reserve(v.list->size());
    for (const Value& x : *v.list) items.push_back(mark_request(x));
    return Value::make_list(std::move(items), v.tuple);
  }
  return v;
}

std::string to_str_tracked(const Value& v, Ranges* ranges) {
  std::string s = to_str(v);
  ranges->clear();
  if (v.kind == Value::Kind::kString) {
    if (v.req) *ranges = *v.req;
  } else if (!s.empty() && has_request_text(v)) {
    ranges->emplace_back(0, s.size());
  }
  return s;
}

void append_tracked(std::string* out, Ranges* out_ranges, std::string_view piece,
                    const Ranges& piece_ranges) {
  const size_t base = out->size();
  out->append(piece);
  for (const auto& [b, e] : piece_ranges) {
    if (!out_ranges->empty() && out_ranges->back().second == base + b) {
      out_ranges->back().second = base + e;
    } else {
      out_ranges->emplace_back(base + b, base + e);
    }
  }
}

Value from_json(const nlohmann::ordered_json& j, bool from_request) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::boolean(j.get<bool>());
    case T::number_integer:
      return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::real(double(u));
      return Value::integer(int64_t(u));
    }
    case T::number_float:
      return Value::real(j.get<double>());
    case T::string: {
      std::string s = j.get<std::string>();
      const size_t n = s.size();
      return from_request ? tracked_string(std::move(s), {{0, n}}) : Value::string(std::move(s));
    }
    case T::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e, from_request));
      return Value::make_list(std::move(items));
    }
    case T::object: {
      Dict d;
      d.keys_from_request = from_request;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e, from_request));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace loom::jinja
