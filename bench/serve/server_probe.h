// What `loom-bench serve` asks the server before loading it: the model it serves (for the report
// and the requests' `model` field), its length limit, and its tokenizer's vocabulary size (so the
// random prompts hold only valid token ids).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "clients/cpp/http_client.h"

namespace loom::bench {

struct ServedModel {
  std::string id;
  std::optional<int64_t> max_model_len;  // Loom extension of the model entry
  std::optional<int64_t> vocab_size;     // `loom_vocab_size`: the tokenizer's id range
};

// GET /v1/models: the first listed model. An unreachable server, a non-2xx reply (a wrong API
// key) or an empty list is an error.
absl::StatusOr<ServedModel> probe_served_model(client::HttpClient& client);

}  // namespace loom::bench
