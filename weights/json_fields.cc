#include "weights/json_fields.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace loom::json_fields {
namespace {

absl::Status wrong_type(const char* key, const char* expected, const nlohmann::json& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("field '", key, "' must be ", expected, ", got ", v.type_name()));
}

const nlohmann::json* find(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<int> as_int(const nlohmann::json& v, const char* key) {
  if (v.is_number_integer()) {
    const auto x = v.get<int64_t>();
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
      return absl::InvalidArgumentError(absl::StrCat("field '", key, "' out of range: ", x));
    return static_cast<int>(x);
  }
  if (v.is_number_unsigned()) {
    const auto x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<int>::max()))
      return absl::InvalidArgumentError(absl::StrCat("field '", key, "' out of range: ", x));
    return static_cast<int>(x);
  }
  return wrong_type(key, "an integer", v);
}

}  // namespace

absl::StatusOr<int> get_int(const nlohmann::json& j, const char* key) {
  const nlohmann::json* v = find(j, key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing integer field '", key, "'"));
  return as_int(*v, key);
}

absl::StatusOr<double> get_number(const nlohmann::json& j, const char* key) {
  const nlohmann::json* v = find(j, key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing number field '", key, "'"));
  if (!v->is_number()) return wrong_type(key, "a number", *v);
  return v->get<double>();
}

absl::StatusOr<bool> get_bool(const nlohmann::json& j, const char* key) {
  const nlohmann::json* v = find(j, key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing boolean field '", key, "'"));
  if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

absl::StatusOr<std::string> get_string(const nlohmann::json& j, const char* key) {
  const nlohmann::json* v = find(j, key);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("missing string field '", key, "'"));
  if (!v->is_string()) return wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<int> get_int_or(const nlohmann::json& j, const char* key, int fallback) {
  const nlohmann::json* v = find(j, key);
  if (!v) return fallback;
  return as_int(*v, key);
}

absl::StatusOr<double> get_number_or(const nlohmann::json& j, const char* key, double fallback) {
  const nlohmann::json* v = find(j, key);
  if (!v) return fallback;
  if (!v->is_number()) return wrong_type(key, "a number", *v);
  return v->get<double>();
}

absl::StatusOr<bool> get_bool_or(const nlohmann::json& j, const char* key, bool fallback) {
  const nlohmann::json* v = find(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

absl::StatusOr<std::vector<int>> get_int_list(const nlohmann::json& j, const char* key) {
  std::vector<int> out;
  const nlohmann::json* v = find(j, key);
  if (!v) return out;
  if (!v->is_array()) return wrong_type(key, "a list of integers", *v);
  for (const auto& e : *v) {
    absl::StatusOr<int> x = as_int(e, key);
    if (!x.ok()) return x.status();
    out.push_back(*x);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> get_string_list(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  const nlohmann::json* v = find(j, key);
  if (!v) return out;
  if (!v->is_array()) return wrong_type(key, "a list of strings", *v);
  for (const auto& e : *v) {
    if (!e.is_string()) return wrong_type(key, "a list of strings", e);
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace loom::json_fields
