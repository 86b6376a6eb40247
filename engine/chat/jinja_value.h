// Values of Loom's Jinja interpreter (engine/chat/jinja_*): the Python objects a Hugging Face chat
// template sees (None, bool, int, float, str, list/tuple, dict keeping insertion order), plus
// jinja2's Undefined, `namespace()` objects and callables (macros, built-in functions, bound
// methods). Printing follows Python (`str()`/`repr()`), JSON follows HF's `tojson`
// (json.dumps(ensure_ascii=False)). Internal to the interpreter; see docs/chat.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace loom::jinja {

// A template error: the message names the problem (and the template line once known). Thrown
// inside the interpreter only; the public entry points return absl::Status.
struct Error {
  std::string message;
  int line = 0;  // 0: not known yet
};
[[noreturn]] void fail(std::string message, int line = 0);

struct Value;
using List = std::vector<Value>;

// Byte ranges [first, second) of a string that came from the request (messages, tools,
// chat_template_kwargs) rather than from the template or the tokenizer config: sorted,
// non-overlapping. The renderer carries them so that a prompt's special tokens can be matched only
// in the template's own text (docs/chat.md).
using Ranges = std::vector<std::pair<size_t, size_t>>;

// A dict with string keys in insertion order (Python 3.7+ dict). Linear lookup: template dicts
// are small.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool keys_from_request = false;  // the keys are request text (a JSON object of the request)
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);  // replaces in place or appends
};

struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                      // kString; kUndefined: the missing name (for messages)
  std::shared_ptr<List> list;         // kList
  bool tuple = false;                 // kList written as a tuple
  std::shared_ptr<Dict> dict;         // kDict, kNamespace (shared: namespaces are mutable)
  std::shared_ptr<Function> fn;       // kFunction
  std::string fn_name;                // kFunction
  std::shared_ptr<const Value> self;  // kFunction: the bound object of a method
  bool macro = false;                 // kFunction: a template macro (tracks its own output)
  std::shared_ptr<const Ranges> req;  // kString: request ranges of `s` (null: none)

  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(List items, bool tuple = false);
  static Value make_dict(Dict d);
  static Value make_namespace(Dict d);
  static Value function(std::string name, Function fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  // Python's bool().
  bool truthy() const;
  // Python's type name, for messages ("str", "NoneType", ...).
  std::string type_name() const;
};

// A call's arguments: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  int line = 0;
  // Argument `index` or keyword `name`, else `fallback` (Undefined when not given).
  Value get(size_t index, std::string_view name, Value fallback = Value::undefined()) const;
};

// A string whose request ranges are `ranges` (merged, empty ones dropped).
Value tracked_string(std::string s, Ranges ranges);
// The request ranges of a string value (empty for anything else).
const Ranges& request_ranges(const Value& v);
// Whether any request text is inside (strings, list items, dict keys and values, recursively).
bool has_request_text(const Value& v);
// `v` with every string in it (recursing into lists and tuples) that carries no request ranges
// marked as request text as a whole: the conservative provenance of a value computed from request
// text by a built-in.
Value mark_request(const Value& v);
// str(v) with its request ranges: a string's own; a container printed whole when it holds request
// text.
std::string to_str_tracked(const Value& v, Ranges* ranges);
// Appends `piece` (with `piece_ranges`) to `out`/`out_ranges`.
void append_tracked(std::string* out, Ranges* out_ranges, std::string_view piece,
                    const Ranges& piece_ranges);

// Python ==.
bool equals(const Value& a, const Value& b);
// Python str() (Undefined -> "", None -> "None", floats as repr, containers as repr).
std::string to_str(const Value& v);
// Python repr().
std::string to_repr(const Value& v);
// Python repr() of a float ("1.0", "1e+16", "1.5e-05", "inf", "nan").
std::string float_repr(double v);

// HF's tojson: json.dumps(v, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys). indent: None (inline), int (spaces) or str. separators: None or a
// 2-sequence of strings. TypeError-like Error on values JSON cannot hold (Undefined, callables).
std::string to_json(const Value& v, const Value& indent, const Value& separators, bool sort_keys);

// JSON document -> Value (objects keep key order; numbers stay int or float as written).
// from_request: every string and object key is request text.
Value from_json(const nlohmann::ordered_json& j, bool from_request = false);

// UTF-8 helpers: code points, and Python's str.isspace() for one code point.
std::vector<std::string_view> utf8_chars(std::string_view s);
bool is_py_space(std::string_view ch);

}  // namespace loom::jinja
