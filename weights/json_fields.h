// Typed reads of config.json fields with errors that name the field and what was expected.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::json_fields {

// Required fields: NotFound/InvalidArgument naming `key` when absent or of the wrong type.
absl::StatusOr<int> get_int(const nlohmann::json& j, const char* key);
absl::StatusOr<double> get_number(const nlohmann::json& j, const char* key);
absl::StatusOr<bool> get_bool(const nlohmann::json& j, const char* key);
absl::StatusOr<std::string> get_string(const nlohmann::json& j, const char* key);

// Optional fields: `fallback` when absent or null; an error when present with the wrong type.
absl::StatusOr<int> get_int_or(const nlohmann::json& j, const char* key, int fallback);
absl::StatusOr<double> get_number_or(const nlohmann::json& j, const char* key, double fallback);
absl::StatusOr<bool> get_bool_or(const nlohmann::json& j, const char* key, bool fallback);
// Lists: empty when absent; an error when present and not a list of that type.
absl::StatusOr<std::vector<int>> get_int_list(const nlohmann::json& j, const char* key);
absl::StatusOr<std::vector<std::string>> get_string_list(const nlohmann::json& j, const char* key);

}  // namespace loom::json_fields
