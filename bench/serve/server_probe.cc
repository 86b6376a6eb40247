#include "bench/serve/server_probe.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom::bench {

using json = nlohmann::json;

absl::StatusOr<ServedModel> probe_served_model(client::HttpClient& client) {
  auto reply = client::json_object_of(client.get("/v1/models"), "GET /v1/models");
  if (!reply.ok()) return reply.status();
  const json& j = *reply;
  if (!j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::DataLossError("GET /v1/models: the reply lists no model");
  }
  const json& m = j["data"][0];
  ServedModel out;
  out.id = m["id"].get<std::string>();
  auto positive = [&m](const char* key) -> std::optional<int64_t> {
    auto it = m.find(key);
    if (it == m.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return std::nullopt;
    return it->get<int64_t>();
  };
  out.max_model_len = positive("max_model_len");
  out.vocab_size = positive("loom_vocab_size");
  return out;
}

}  // namespace loom::bench
