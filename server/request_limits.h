// Request limits both API frontends enforce beyond SamplingParams::validate's (HTTP:
// server/openai_request.cc, gRPC: server/grpc_convert.cc).
#pragma once

namespace loom {

// stop_token_ids per request (vLLM's extension over HTTP; sampling.stop_token_ids over gRPC).
// Each id is checked on every sampled token, so the list stays short.
inline constexpr int kMaxStopTokenIds = 64;

}  // namespace loom
