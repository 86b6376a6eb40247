// HttpContext: what every HTTP session and route handler shares. Constant after HttpServer::start
// except the atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/admission.h"
#include "server/chat_setup.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/server_options.h"
#include "server/stream_pump.h"

namespace loom {

struct HttpContext {
  Engine* engine = nullptr;
  std::shared_ptr<const Tokenizer> tokenizer;
  ChatSetup chat;  // how chat prompts are rendered and replies read
  Metrics* metrics = nullptr;
  HttpOptions options;
  StreamPump* pump = nullptr;          // the server's (HttpServer::pump())
  AdmissionGate* admission = nullptr;  // shared with the other frontends (main.cc)
  int64_t started_unix = 0;
  // Responses stored by POST /v1/responses (server/responses_route.h); shared with their builders.
  std::shared_ptr<ResponseStore> responses;

  std::atomic<bool> draining{false};      // new requests get 503
  std::atomic<int64_t> in_flight{0};      // generations between submit and their last byte
  std::atomic<uint64_t> next_request{1};  // for response ids
};

}  // namespace loom
