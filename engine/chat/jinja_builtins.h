// Built-ins of Loom's Jinja interpreter: Python semantics of operators, attribute and item
// access, iteration and membership; the filters, tests, str/dict/list methods and globals
// (range, namespace, dict, raise_exception, strftime_now) that chat templates use. Unknown names
// are errors naming them.
#pragma once

#include <string_view>
#include <vector>

#include "engine/chat/jinja_value.h"

namespace loom::jinja {

Value apply_filter(std::string_view name, const Value& value, CallArgs& args);
bool apply_test(std::string_view name, const Value& value, CallArgs& args);

// obj.name: dict keys (after dict methods, as Python's getattr then getitem), namespace
// attributes, str/dict/list methods. Undefined when missing; an error on Undefined itself.
Value get_attr(const Value& obj, std::string_view name);
// obj[key]: dict key, list/str index (negative from the end). Undefined when missing.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on a list, tuple or str (null Values: absent).
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);

// The items a for loop visits: list items, dict keys, str characters; none for Undefined.
std::vector<Value> iterate(const Value& v);
// Python `item in container`.
bool contains(const Value& container, const Value& item);
// Python arithmetic: + - * / // % ** and jinja's ~.
Value binary_op(std::string_view op, const Value& a, const Value& b);
// Python < <= > >=.
bool ordered_compare(std::string_view op, const Value& a, const Value& b);
// Unary minus / plus.
Value negate(const Value& v, bool minus);

// range, namespace, dict, raise_exception, strftime_now.
Dict make_globals();

}  // namespace loom::jinja
