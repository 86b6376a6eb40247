// Conversions between the loom.v1 gRPC messages and the engine's types, and absl -> gRPC status
// mapping. Pure functions (no server state), so request validation is unit-tested without a server.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "grpcpp/support/status.h"
#include "loom/v1/loom.pb.h"

namespace loom {

// Builds the engine Request of a GenerateRequest: tokenizes a text prompt (`tokenizer` may be
// null: then a text prompt is FailedPrecondition), copies the sampling fields (unset optional ones
// keep SamplingParams' defaults) and validates them against `vocab_size` and `max_model_len` (0:
// no limit). InvalidArgument naming the field for anything out of range, so a bad request never
// reaches the engine.
absl::StatusOr<Request> request_from_proto(const v1::GenerateRequest& in,
                                           const Tokenizer* tokenizer, int vocab_size,
                                           int max_model_len);

// INVALID_ARGUMENT naming the first field of `message` or of a message inside it (sampling,
// token_ids, map entries) that this server's loom.v1 does not know: a newer client's field, which
// would otherwise be dropped without a word. "sampling: unknown field number 17 ...".
absl::Status check_no_unknown_fields(const google::protobuf::Message& message);

// One engine event as a GenerateResponse.
void response_from_output(const RequestOutput& out, v1::GenerateResponse* resp);

v1::FinishReason finish_reason_to_proto(FinishReason reason);

// absl::Status -> grpc::Status with the same canonical code and message.
grpc::Status to_grpc_status(const absl::Status& status);

}  // namespace loom
