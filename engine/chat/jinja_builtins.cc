#include "engine/chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string>

namespace loom::jinja {
namespace {

using K = Value::Kind;

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.s.empty() ? "undefined value used" : v.s);
}

void check_defined(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
}

std::string type_of(const Value& v) {
  std::string out = "'";
  out += v.type_name();
  out += '\'';
  return out;
}

const std::string& str_arg(const Value& v, std::string_view what) {
  if (!v.is_string()) {
    if (v.is_undefined()) fail_undefined(v);
    fail(std::string(what) + " must be a string, not " + v.type_name());
  }
  return v.s;
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (v.kind == K::kInt) return v.i;
  if (v.kind == K::kBool) return v.b;
  if (v.is_undefined()) fail_undefined(v);
  fail(std::string(what) + " must be an integer, not " + v.type_name());
}

double as_double(const Value& v) {
  return v.kind == K::kFloat ? v.f : v.kind == K::kInt ? double(v.i) : double(v.b);
}

int64_t as_int(const Value& v) { return v.kind == K::kInt ? v.i : int64_t(v.b); }

std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
  }
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string title_case(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
  return out;
}

// Python str.strip family: chars None -> whitespace, else the code points of `chars`.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<std::string_view> cs = utf8_chars(s);
  std::vector<std::string_view> set;
  const bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) set = utf8_chars(str_arg(chars, "strip() argument"));
  auto strip_it = [&](std::string_view ch) {
    if (ws) return is_py_space(ch);
    return std::find(set.begin(), set.end(), ch) != set.end();
  };
  size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && strip_it(cs[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cs[e - 1])) --e;
  }
  std::string out;
  for (size_t k = b; k < e; ++k) out += cs[k];
  return out;
}

Value py_split(const std::string& s, const Value& sep_v, const Value& maxsplit_v) {
  int64_t maxsplit = maxsplit_v.is_undefined() ? -1 : int_arg(maxsplit_v, "maxsplit");
  List out;
  if (sep_v.is_none() || sep_v.is_undefined()) {
    std::vector<std::string_view> cs = utf8_chars(s);
    size_t k = 0;
    while (k < cs.size()) {
      while (k < cs.size() && is_py_space(cs[k])) ++k;
      if (k == cs.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::string rest;
        for (size_t j = k; j < cs.size(); ++j) rest += cs[j];
        // Python keeps trailing whitespace out of the last piece only when splitting.
        out.push_back(Value::string(py_strip(rest, Value::none(), false, true)));
        break;
      }
      std::string word;
      while (k < cs.size() && !is_py_space(cs[k])) word += cs[k++];
      out.push_back(Value::string(word));
    }
    return Value::make_list(std::move(out));
  }
  const std::string& sep = str_arg(sep_v, "split() separator");
  if (sep.empty()) fail("split(): empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) break;
    size_t at = s.find(sep, start);
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(start, at - start)));
    start = at + sep.size();
  }
  out.push_back(Value::string(s.substr(start)));
  return Value::make_list(std::move(out));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    std::vector<std::string_view> cs = utf8_chars(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (k < cs.size()) out += cs[k];
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + repl;
    start = at + old.size();
    ++n;
  }
  return out + s.substr(start);
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list() && affix.tuple) {
    for (const Value& a : *affix.list) {
      if (one(str_arg(a, "startswith/endswith argument"))) return true;
    }
    return false;
  }
  return one(str_arg(affix, prefix ? "startswith() argument" : "endswith() argument"));
}

Value bound(std::string name, Function fn) {
  return Value::function(std::move(name), std::move(fn));
}

Value str_method(const Value& obj, std::string_view name) {
  const std::string s = obj.s;
  const std::string n(name);
  if (n == "split") {
    return bound(n,
                 [s](CallArgs& a) { return py_split(s, a.get(0, "sep"), a.get(1, "maxsplit")); });
  }
  if (n == "strip" || n == "lstrip" || n == "rstrip") {
    return bound(n, [s, n](CallArgs& a) {
      return Value::string(py_strip(s, a.get(0, "chars"), n != "rstrip", n != "lstrip"));
    });
  }
  if (n == "startswith" || n == "endswith") {
    return bound(n, [s, n](CallArgs& a) {
      return Value::boolean(affix_match(s, a.get(0, "prefix"), n == "startswith"));
    });
  }
  if (n == "replace") {
    return bound(n, [s](CallArgs& a) {
      Value count = a.get(2, "count");
      return Value::string(py_replace(s, str_arg(a.get(0, "old"), "replace() argument"),
                                      str_arg(a.get(1, "new"), "replace() argument"),
                                      count.is_undefined() ? -1 : int_arg(count, "count")));
    });
  }
  if (n == "upper") return bound(n, [s](CallArgs&) { return Value::string(ascii_upper(s)); });
  if (n == "lower") return bound(n, [s](CallArgs&) { return Value::string(ascii_lower(s)); });
  if (n == "title") return bound(n, [s](CallArgs&) { return Value::string(title_case(s)); });
  if (n == "capitalize") return bound(n, [s](CallArgs&) { return Value::string(capitalize(s)); });
  if (n == "find" || n == "count") {
    return bound(n, [s, n](CallArgs& a) {
      const std::string& sub = str_arg(a.get(0, "sub"), n + "() argument");
      if (n == "find") {
        size_t at = s.find(sub);
        return Value::integer(
            at == std::string::npos ? -1 : int64_t(utf8_chars(s.substr(0, at)).size()));
      }
      if (sub.empty()) return Value::integer(int64_t(utf8_chars(s).size()) + 1);
      int64_t c = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++c;
      return Value::integer(c);
    });
  }
  if (n == "join") {
    return bound(n, [s](CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.get(0, "iterable"))) {
        if (!first) out += s;
        first = false;
        out += str_arg(v, "join() item");
      }
      return Value::string(out);
    });
  }
  if (n == "isdigit" || n == "isspace" || n == "isalpha" || n == "isalnum") {
    return bound(n, [s, n](CallArgs&) {
      if (s.empty()) return Value::boolean(false);
      for (std::string_view ch : utf8_chars(s)) {
        const char c = ch[0];
        bool ok = n == "isspace"   ? is_py_space(ch)
                  : n == "isdigit" ? (c >= '0' && c <= '9')
                  : n == "isalpha" ? is_alpha(c)
                                   : (is_alpha(c) || (c >= '0' && c <= '9'));
        if (!ok || (n != "isspace" && ch.size() > 1)) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + n + "'");
}

Value dict_method(const Value& obj, std::string_view name, bool* found) {
  *found = true;
  auto d = obj.dict;
  const std::string n(name);
  if (n == "get") {
    return bound(n, [d](CallArgs& a) {
      Value key = a.get(0, "key");
      Value fallback = a.get(1, "default", Value::none());
      if (!key.is_string()) return fallback;
      const Value* v = d->find(key.s);
      return v ? *v : fallback;
    });
  }
  if (n == "items") {
    return bound(n, [d](CallArgs&) {
      List out;
      for (const auto& [k, v] : d->items)
        out.push_back(Value::make_list({Value::string(k), v}, true));
      return Value::make_list(std::move(out));
    });
  }
  if (n == "keys") {
    return bound(n, [d](CallArgs&) {
      List out;
      for (const auto& kv : d->items) out.push_back(Value::string(kv.first));
      return Value::make_list(std::move(out));
    });
  }
  if (n == "values") {
    return bound(n, [d](CallArgs&) {
      List out;
      for (const auto& kv : d->items) out.push_back(kv.second);
      return Value::make_list(std::move(out));
    });
  }
  if (n == "copy") return bound(n, [d](CallArgs&) { return Value::make_dict(*d); });
  if (n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear" ||
      n == "fromkeys") {
    return bound(n, [n](CallArgs&) -> Value {
      fail("access to attribute '" + n + "' of 'dict' object is unsafe (immutable sandbox)");
    });
  }
  *found = false;
  return {};
}

Value list_method(const Value& obj, std::string_view name) {
  const std::string n(name);
  auto l = obj.list;
  if (n == "index" || n == "count") {
    return bound(n, [l, n](CallArgs& a) {
      Value x = a.get(0, "value");
      int64_t c = 0;
      for (size_t k = 0; k < l->size(); ++k) {
        if (equals((*l)[k], x)) {
          if (n == "index") return Value::integer(int64_t(k));
          ++c;
        }
      }
      if (n == "index") fail("list.index(x): x not in list");
      return Value::integer(c);
    });
  }
  if (n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" ||
      n == "reverse" || n == "sort" || n == "clear") {
    return bound(n, [n](CallArgs&) -> Value {
      fail("access to attribute '" + n + "' of 'list' object is unsafe (immutable sandbox)");
    });
  }
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + n + "'");
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case K::kUndefined:
      return 0;
    case K::kString:
      return int64_t(utf8_chars(v.s).size());
    case K::kList:
      return int64_t(v.list->size());
    case K::kDict:
      return int64_t(v.dict->items.size());
    default:
      fail("object of type " + type_of(v) + " has no len()");
  }
}

Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, Value::integer(std::stoll(part)))
                 : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Shifts a filter/test call's arguments left by `skip` (select('test', args...)).
CallArgs rest_args(const CallArgs& a, size_t skip) {
  CallArgs r;
  r.line = a.line;
  for (size_t k = skip; k < a.args.size(); ++k) r.args.push_back(a.args[k]);
  r.kwargs = a.kwargs;
  return r;
}

Value select_like(const Value& v, CallArgs& a, bool by_attr, bool keep) {
  List out;
  std::string attr;
  size_t skip = 0;
  if (by_attr) {
    attr = str_arg(a.get(0, "attribute"), "attribute name");
    skip = 1;
  }
  Value test = a.get(skip, "");
  CallArgs targs = rest_args(a, skip + 1);
  targs.kwargs.clear();
  for (const Value& item : iterate(v)) {
    Value x = by_attr ? attr_path(item, attr) : item;
    bool ok = test.is_undefined() ? x.truthy() : apply_test(str_arg(test, "test name"), x, targs);
    if (ok == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string ensure_ascii(const std::string& s) {
  std::string out;
  for (std::string_view ch : utf8_chars(s)) {
    if (ch.size() == 1) {
      out += ch;
      continue;
    }
    auto u = [&](size_t k) { return uint32_t(static_cast<unsigned char>(ch[k])); };
    uint32_t cp = ch.size() == 2   ? ((u(0) & 0x1f) << 6) | (u(1) & 0x3f)
                  : ch.size() == 3 ? ((u(0) & 0x0f) << 12) | ((u(1) & 0x3f) << 6) | (u(2) & 0x3f)
                                   : ((u(0) & 0x07) << 18) | ((u(1) & 0x3f) << 12) |
                                         ((u(2) & 0x3f) << 6) | (u(3) & 0x3f);
    char buf[16];
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    }
    out += buf;
  }
  return out;
}

}  // namespace

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case K::kUndefined:
      return {};
    case K::kList:
      return *v.list;
    case K::kDict: {
      std::vector<Value> out;
      for (const auto& kv : v.dict->items) {
        Value key = Value::string(kv.first);
        out.push_back(v.dict->keys_from_request ? mark_request(key) : key);
      }
      return out;
    }
    case K::kString: {
      std::vector<Value> out;
      for (std::string_view ch : utf8_chars(v.s)) {
        Value c = Value::string(std::string(ch));
        out.push_back(v.req ? mark_request(c) : c);
      }
      return out;
    }
    default:
      fail(type_of(v) + " object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case K::kUndefined:
      return false;
    case K::kString:
      if (!item.is_string()) {
        fail("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.s.find(item.s) != std::string::npos;
    case K::kList:
      for (const Value& v : *container.list) {
        if (equals(v, item)) return true;
      }
      return false;
    case K::kDict:
      return item.is_string() && container.dict->find(item.s) != nullptr;
    default:
      fail("argument of type " + type_of(container) + " is not iterable");
  }
}

namespace {

// Records the receiver of a bound method, so the renderer can see where its result came from.
Value with_self(Value method, const Value& obj) {
  if (method.kind == K::kFunction) method.self = std::make_shared<const Value>(obj);
  return method;
}

}  // namespace

Value get_attr(const Value& obj, std::string_view name) {
  switch (obj.kind) {
    case K::kUndefined:
      fail_undefined(obj);
    case K::kDict: {
      bool found = false;
      Value m = dict_method(obj, name, &found);
      if (found) return with_self(std::move(m), obj);
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + std::string(name) + "'");
    }
    case K::kNamespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + std::string(name) + "'");
    case K::kString:
      return with_self(str_method(obj, name), obj);
    case K::kList:
      return with_self(list_method(obj, name), obj);
    default:
      return Value::undefined("'" + obj.type_name() + " object' has no attribute '" +
                              std::string(name) + "'");
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind == K::kDict) {
    if (key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      bool found = false;
      Value m = dict_method(obj, key.s, &found);
      if (found) return with_self(std::move(m), obj);
    }
    return Value::undefined("'dict object' has no attribute '" + to_str(key) + "'");
  }
  if ((obj.kind == K::kList || obj.kind == K::kString) &&
      (key.kind == K::kInt || key.kind == K::kBool)) {
    int64_t i = as_int(key);
    if (obj.kind == K::kList) {
      int64_t n = int64_t(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return Value::undefined("'" + obj.type_name() + " object' has no element " + to_str(key));
      }
      return (*obj.list)[size_t(i)];
    }
    std::vector<std::string_view> cs = utf8_chars(obj.s);
    int64_t n = int64_t(cs.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("'str object' has no element " + to_str(key));
    Value c = Value::string(std::string(cs[size_t(i)]));
    return obj.req ? mark_request(c) : c;
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined("'" + obj.type_name() + " object' has no element " + to_repr(key));
}

Value get_slice(const Value& obj, const Value* start_v, const Value* stop_v, const Value* step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind != K::kList && obj.kind != K::kString) {
    fail(type_of(obj) + " object is not subscriptable");
  }
  auto opt = [](const Value* v) { return v == nullptr || v->is_none(); };
  int64_t step = opt(step_v) ? 1 : int_arg(*step_v, "slice step");
  if (step == 0) fail("slice step cannot be zero");
  std::vector<std::string_view> cs;
  int64_t n;
  if (obj.kind == K::kString) {
    cs = utf8_chars(obj.s);
    n = int64_t(cs.size());
  } else {
    n = int64_t(obj.list->size());
  }
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (opt(v)) return dflt;
    int64_t i = int_arg(*v, "slice index");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t start = clamp(start_v, step > 0 ? 0 : n - 1);
  int64_t stop = clamp(stop_v, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
  if (obj.kind == K::kString) {
    std::string out;
    for (int64_t i : idx) out += cs[size_t(i)];
    return obj.req ? mark_request(Value::string(out)) : Value::string(out);
  }
  List out;
  for (int64_t i : idx) out.push_back((*obj.list)[size_t(i)]);
  return Value::make_list(std::move(out), obj.tuple);
}

Value negate(const Value& v, bool minus) {
  if (v.kind == K::kFloat) return Value::real(minus ? -v.f : v.f);
  if (v.kind == K::kInt || v.kind == K::kBool)
    if (minus && as_int(v) == INT64_MIN)
      fail("integer overflow (Loom's template integers are 64-bit)");
  return Value::integer(minus ? -as_int(v) : as_int(v));
  check_defined(v);
  fail(std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": " + type_of(v));
}

namespace {

constexpr size_t kMaxString = size_t(64) << 20;

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    Ranges ra, rb;
    std::string sa = to_str_tracked(a, &ra);
    std::string sb = to_str_tracked(b, &rb);
    if (sa.size() + sb.size() > kMaxString) fail("string exceeds 64 MiB");
    Ranges out = ra;
    for (const auto& [x, y] : rb) out.emplace_back(x + sa.size(), y + sa.size());
    return tracked_string(sa + sb, std::move(out));
  }
  check_defined(a);
  check_defined(b);
  if (a.is_number() && b.is_number()) {
    const bool fl = a.kind == K::kFloat || b.kind == K::kFloat;
    if (op == "/") {
      if (as_double(b) == 0) fail("division by zero");
      return Value::real(as_double(a) / as_double(b));
    }
    if (fl) {
      double x = as_double(a), y = as_double(b);
      if (op == "+") return Value::real(x + y);
      if (op == "-") return Value::real(x - y);
      if (op == "*") return Value::real(x * y);
      if (op == "**") return Value::real(std::pow(x, y));
      if (y == 0) fail("float division by zero");
      if (op == "//") return Value::real(std::floor(x / y));
      if (op == "%") {
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::real(r);
      }
    } else {
      int64_t x = as_int(a), y = as_int(b);
      // Python's integers do not overflow; Loom's are 64-bit and refuse to.
      auto checked = [](bool overflow, int64_t r) {
        if (overflow) fail("integer overflow (Loom's template integers are 64-bit)");
        return Value::integer(r);
      };
      int64_t r = 0;
      if (op == "+") {
        const bool overflow = __builtin_add_overflow(x, y, &r);
        return checked(overflow, r);
      }
      if (op == "-") {
        const bool overflow = __builtin_sub_overflow(x, y, &r);
        return checked(overflow, r);
      }
      if (op == "*") {
        const bool overflow = __builtin_mul_overflow(x, y, &r);
        return checked(overflow, r);
      }
      if (op == "**") {
        if (y < 0) return Value::real(std::pow(double(x), double(y)));
        r = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(r, x, &r)) return checked(true, 0);
          if (r == 0 || r == 1) break;  // 0 ** y, 1 ** y
          if (r == -1 && k + 1 < y) {   // (-1) ** y
            r = ((y - k - 1) % 2 == 0) ? -1 : 1;
            break;
          }
        }
        return Value::integer(r);
      }
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return checked(true, 0);
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      if (op == "//") return Value::integer(q);
      if (op == "%") return Value::integer(x - q * y);
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.s.size() + b.s.size() > kMaxString) fail("string exceeds 64 MiB");
    Ranges out = request_ranges(a);
    for (const auto& [x, y] : request_ranges(b)) out.emplace_back(x + a.s.size(), y + a.s.size());
    return tracked_string(a.s + b.s, std::move(out));
  }
  if (op == "+" && a.is_list() && b.is_list() && a.tuple == b.tuple) {
    if (a.list->size() + b.list->size() > kMaxString / 16) fail("list too large");
    List out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(out), a.tuple);
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.kind == K::kInt || b.kind == K::kBool)) {
    int64_t n = std::max<int64_t>(as_int(b), 0);
    const size_t unit = a.is_string() ? a.s.size() : a.list->size() * 16;
    if (n > 0 && unit > 0 && size_t(n) > kMaxString / unit) fail("repetition result too large");
    if (n > int64_t(kMaxString)) fail("repetition count too large");
    if (a.is_string()) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += a.s;
      return a.req ? mark_request(Value::string(out)) : Value::string(out);
    }
    List out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), a.list->begin(), a.list->end());
    return Value::make_list(std::move(out), a.tuple);
  }
  if (op == "*" && (b.is_string() || b.is_list()) && (a.kind == K::kInt || a.kind == K::kBool)) {
    return binary_op(op, b, a);
  }
  if (op == "%" && a.is_string()) {
    fail("unsupported Jinja construct: printf-style string formatting ('%')");
  }
  fail("unsupported operand type(s) for " + std::string(op) + ": " + type_of(a) + " and " +
       type_of(b));
}

bool ordered_compare(std::string_view op, const Value& a, const Value& b) {
  check_defined(a);
  check_defined(b);
  int c;
  if (a.is_number() && b.is_number()) {
    double x = as_double(a), y = as_double(b);
    if (a.kind != K::kFloat && b.kind != K::kFloat) {
      c = as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    } else {
      c = x < y ? -1 : x > y ? 1 : 0;
    }
  } else if (a.is_string() && b.is_string()) {
    c = a.s.compare(b.s);
    c = c < 0 ? -1 : c > 0 ? 1 : 0;
  } else if (a.is_list() && b.is_list()) {
    size_t k = 0;
    while (k < a.list->size() && k < b.list->size() && equals((*a.list)[k], (*b.list)[k])) ++k;
    if (k < a.list->size() && k < b.list->size())
      return ordered_compare(op, (*a.list)[k], (*b.list)[k]);
    c = a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  } else {
    fail("'" + std::string(op) + "' not supported between instances of " + type_of(a) + " and " +
         type_of(b));
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

bool apply_test(std::string_view name, const Value& v, CallArgs& a) {
  const std::string n(name);
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.kind == K::kInt;
  if (n == "float") return v.kind == K::kFloat;
  if (n == "boolean") return v.kind == K::kBool;
  if (n == "true") return v.kind == K::kBool && v.b;
  if (n == "false") return v.kind == K::kBool && !v.b;
  if (n == "mapping") return v.kind == K::kDict;
  if (n == "iterable") {
    return v.kind == K::kList || v.kind == K::kDict || v.kind == K::kString || v.is_undefined();
  }
  if (n == "sequence") return v.kind == K::kList || v.kind == K::kDict || v.kind == K::kString;
  if (n == "callable") return v.kind == K::kFunction;
  if (n == "lower") return v.is_string() && ascii_lower(v.s) == v.s;
  if (n == "upper") return v.is_string() && ascii_upper(v.s) == v.s;
  if (n == "escaped") return false;
  if (n == "even" || n == "odd") {
    if (v.kind == K::kFloat) {  // Python: value % 2 == 0 / == 1
      double r = std::fmod(v.f, 2.0);
      if (r < 0) r += 2.0;
      return n == "even" ? r == 0 : r == 1;
    }
    int64_t x = int_arg(v, "even/odd test value");
    return (x % 2 == 0) == (n == "even");
  }
  if (n == "divisibleby") {
    int64_t d = int_arg(a.get(0, "num"), "divisibleby argument");
    if (d == 0) fail("integer division or modulo by zero");
    return int_arg(v, "divisibleby test value") % d == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") return equals(v, a.get(0, "other"));
  if (n == "ne" || n == "!=") return !equals(v, a.get(0, "other"));
  if (n == "lt" || n == "lessthan" || n == "<") return ordered_compare("<", v, a.get(0, "other"));
  if (n == "le" || n == "<=") return ordered_compare("<=", v, a.get(0, "other"));
  if (n == "gt" || n == "greaterthan" || n == ">")
    return ordered_compare(">", v, a.get(0, "other"));
  if (n == "ge" || n == ">=") return ordered_compare(">=", v, a.get(0, "other"));
  if (n == "in") return contains(a.get(0, "seq"), v);
  if (n == "sameas") {
    Value o = a.get(0, "other");
    if (v.kind != o.kind) return false;
    if (v.is_none()) return true;
    if (v.kind == K::kBool) return v.b == o.b;
    return equals(v, o) && v.list == o.list && v.dict == o.dict;
  }
  fail("unknown Jinja test '" + n + "'");
}

Value apply_filter(std::string_view name, const Value& v, CallArgs& a) {
  const std::string n(name);
  if (n == "tojson") {
    Value sort = a.get(3, "sort_keys", Value::boolean(false));
    std::string out = to_json(v, a.get(1, "indent", Value::none()),
                              a.get(2, "separators", Value::none()), sort.truthy());
    if (a.get(0, "ensure_ascii", Value::boolean(false)).truthy()) out = ensure_ascii(out);
    return Value::string(out);
  }
  if (n == "length" || n == "count") return Value::integer(length_of(v));
  if (n == "string") return Value::string(to_str(v));
  if (n == "safe") return v;
  if (n == "e" || n == "escape" || n == "forceescape") return Value::string(html_escape(to_str(v)));
  if (n == "trim") {
    return Value::string(py_strip(to_str(v), a.get(0, "chars", Value::none()), true, true));
  }
  if (n == "lower") return Value::string(ascii_lower(to_str(v)));
  if (n == "upper") return Value::string(ascii_upper(to_str(v)));
  if (n == "capitalize") return Value::string(capitalize(to_str(v)));
  if (n == "title") return Value::string(title_case(to_str(v)));
  if (n == "default" || n == "d") {
    Value dflt = a.get(0, "default_value", Value::string(""));
    bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
    return v;
  }
  if (n == "join") {
    const std::string sep = to_str(a.get(0, "d", Value::string("")));
    Value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attr.is_undefined() ? item : attr_path(item, to_str(attr)));
    }
    return Value::string(out);
  }
  if (n == "first" || n == "last") {
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No " + n + " item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "list") return Value::make_list(iterate(v));
  if (n == "items") {
    if (v.is_undefined()) return Value::make_list({});
    if (v.kind != K::kDict) fail("items filter: can only get item pairs from a mapping");
    List out;
    for (const auto& [k, x] : v.dict->items)
      out.push_back(Value::make_list({Value::string(k), x}, true));
    return Value::make_list(std::move(out));
  }
  if (n == "reverse") {
    if (v.is_string()) {
      std::vector<std::string_view> cs = utf8_chars(v.s);
      std::string out;
      for (size_t k = cs.size(); k-- > 0;) out += cs[k];
      return Value::string(out);
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (n == "unique") {
    List out;
    for (const Value& item : iterate(v)) {
      bool seen = false;
      for (const Value& o : out) seen = seen || equals(o, item);
      if (!seen) out.push_back(item);
    }
    return Value::make_list(std::move(out));
  }
  if (n == "replace") {
    Value count = a.get(2, "count", Value::none());
    return Value::string(py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                    count.is_none() ? -1 : int_arg(count, "count")));
  }
  if (n == "int" || n == "float" || n == "abs") check_defined(v);  // int(Undefined) raises
  if (n == "int") {
    Value dflt = a.get(0, "default", Value::integer(0));
    if (v.kind == K::kInt || v.kind == K::kBool) return Value::integer(as_int(v));
    if (v.kind == K::kFloat) return Value::integer(int64_t(v.f));
    if (v.is_string()) {
      std::string t = py_strip(v.s, Value::none(), true, true);
      try {
        size_t used = 0;
        long long x = std::stoll(t, &used, 10);
        if (used == t.size()) return Value::integer(x);
        double d = std::stod(t, &used);
        if (used == t.size()) return Value::integer(int64_t(d));
      } catch (...) {
      }
    }
    return dflt;
  }
  if (n == "float") {
    Value dflt = a.get(0, "default", Value::real(0.0));
    if (v.is_number()) return Value::real(as_double(v));
    if (v.is_string()) {
      try {
        std::string t = py_strip(v.s, Value::none(), true, true);
        size_t used = 0;
        double d = std::stod(t, &used);
        if (used == t.size()) return Value::real(d);
      } catch (...) {
      }
    }
    return dflt;
  }
  if (n == "abs") {
    if (v.kind == K::kFloat) return Value::real(std::fabs(v.f));
    const int64_t x = int_arg(v, "abs argument");
    if (x == INT64_MIN) fail("integer overflow (Loom's template integers are 64-bit)");
    return Value::integer(x < 0 ? -x : x);
  }
  if (n == "attr") return get_attr(v, str_arg(a.get(0, "name"), "attr name"));
  if (n == "map") {
    List out;
    Value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      Value dflt = a.get(99, "default");
      for (const Value& item : iterate(v)) {
        Value x = attr_path(item, to_str(attr));
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
    } else {
      const std::string f = str_arg(a.get(0, ""), "map filter name");
      CallArgs fargs = rest_args(a, 1);
      for (const Value& item : iterate(v)) out.push_back(apply_filter(f, item, fargs));
    }
    return Value::make_list(std::move(out));
  }
  if (n == "dictsort" || n == "sort") {
    // jinja2: case-insensitive by default (strings compared lowercased), stable.
    const bool dict = n == "dictsort";
    const bool case_sensitive =
        a.get(dict ? 0 : 1, "case_sensitive", Value::boolean(false)).truthy();
    const bool by_value = dict && to_str(a.get(1, "by", Value::string("key"))) == "value";
    const bool reverse = a.get(dict ? 2 : 0, "reverse", Value::boolean(false)).truthy();
    const Value attr = dict ? Value::undefined() : a.get(2, "attribute");
    List items;
    if (dict) {
      if (v.kind != K::kDict) fail("dictsort: can only sort a mapping, not " + v.type_name());
      for (const auto& [k, x] : v.dict->items) {
        items.push_back(Value::make_list({Value::string(k), x}, true));
      }
    } else {
      items = iterate(v);
    }
    auto key_of = [&](const Value& item) {
      Value key = dict ? (*item.list)[by_value ? 1 : 0]
                       : (attr.is_undefined() ? item : attr_path(item, to_str(attr)));
      if (!case_sensitive && key.is_string()) key = Value::string(ascii_lower(key.s));
      return key;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? ordered_compare("<", key_of(y), key_of(x))
                     : ordered_compare("<", key_of(x), key_of(y));
    });
    return Value::make_list(std::move(items));
  }
  if (n == "select") return select_like(v, a, false, true);
  if (n == "reject") return select_like(v, a, false, false);
  if (n == "selectattr") return select_like(v, a, true, true);
  if (n == "rejectattr") return select_like(v, a, true, false);
  if (n == "indent") {
    Value w = a.get(0, "width", Value::integer(4));
    std::string pad =
        w.is_string() ? w.s : std::string(size_t(std::max<int64_t>(int_arg(w, "width"), 0)), ' ');
    bool first = a.get(1, "first", Value::boolean(false)).truthy();
    bool blank = a.get(2, "blank", Value::boolean(false)).truthy();
    std::string s = to_str(v), out;
    size_t start = 0;
    bool is_first = true;
    while (true) {
      size_t nl = s.find('\n', start);
      std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      if ((!is_first || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += "\n";
      start = nl + 1;
      is_first = false;
    }
    return Value::string(out);
  }
  fail("unknown Jinja filter '" + n + "'");
}

Dict make_globals() {
  Dict g;
  g.set("range", Value::function("range", [](CallArgs& a) {
          int64_t start = 0, stop, step = 1;
          if (a.args.size() == 1) {
            stop = int_arg(a.args[0], "range() argument");
          } else if (a.args.size() == 2 || a.args.size() == 3) {
            start = int_arg(a.args[0], "range() argument");
            stop = int_arg(a.args[1], "range() argument");
            if (a.args.size() == 3) step = int_arg(a.args[2], "range() argument");
          } else {
            fail("range expected 1 to 3 arguments");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000) fail("range too big (more than 100000 items)");
            out.push_back(Value::integer(i));
          }
          return Value::make_list(std::move(out));
        }));
  g.set("namespace", Value::function("namespace", [](CallArgs& a) {
          Dict d;
          for (const Value& p : a.args) {
            if (p.kind != K::kDict) fail("namespace() positional argument must be a dict");
            for (const auto& kv : p.dict->items) d.set(kv.first, kv.second);
          }
          for (const auto& kv : a.kwargs) d.set(kv.first, kv.second);
          return Value::make_namespace(std::move(d));
        }));
  g.set("dict", Value::function("dict", [](CallArgs& a) {
          Dict d;
          for (const Value& p : a.args) {
            if (p.kind != K::kDict) fail("dict() positional argument must be a dict");
            for (const auto& kv : p.dict->items) d.set(kv.first, kv.second);
          }
          for (const auto& kv : a.kwargs) d.set(kv.first, kv.second);
          return Value::make_dict(std::move(d));
        }));
  g.set("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
          fail("raise_exception: " + to_str(a.get(0, "message")));
        }));
  g.set("strftime_now", Value::function("strftime_now", [](CallArgs& a) {
          const std::string& fmt = str_arg(a.get(0, "format"), "strftime_now() format");
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          size_t len = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
          return Value::string(std::string(buf, len));
        }));
  return g;
}

}  // namespace loom::jinja
