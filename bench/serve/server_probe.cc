#include "bench/serve/server_probe.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom::bench {

using json = nlohmann::json;

absl::StatusOr<ServedModel> probe_served_model(client::HttpClient& client) {
  auto reply = client.get("/v1/models");
  if (!reply.ok()) return reply.status();
  if (absl::Status s = client::status_from_reply(*reply); !s.ok()) return s;
  json j = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::DataLossError("GET /v1/models: the reply lists no model");
  }
  const json& m = j["data"][0];
  ServedModel out;
  out.id = m["id"].get<std::string>();
  if (m.contains("max_model_len") && m["max_model_len"].is_number_integer() &&
      m["max_model_len"].get<int64_t>() > 0) {
    out.max_model_len = m["max_model_len"].get<int64_t>();
  }
  if (m.contains("loom_vocab_size") && m["loom_vocab_size"].is_number_integer() &&
      m["loom_vocab_size"].get<int64_t>() > 0) {
    out.vocab_size = m["loom_vocab_size"].get<int64_t>();
  }
  return out;
}

}  // namespace loom::bench
