// One measured streaming completion: the timings `loom-bench serve` aggregates per level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clients/cpp/http_client.h"

namespace loom::bench {

// What one request measured. Times are seconds from just before the request is sent (connect
// included: the client opens one connection per request, as a fresh user would).
struct RequestRecord {
  bool ok = false;
  std::string error;  // why it failed; empty when ok
  // False when the stream finished without any text: every token decoded to nothing the server
  // could send yet (ids beyond the tokenizer's vocabulary, as in fixtures whose model vocabulary
  // is larger; or an unfinished UTF-8 sequence). Such a request is ok (its tokens count) but
  // has no TTFT, ITL or TPOT. With logprobs requested every token streams a chunk, so a chunk
  // with a token's logprob counts as text here.
  bool has_text = false;
  double ttft_s = 0;  // to the first chunk with non-empty text (or a logprob); when has_text
  std::vector<double> itl_s;  // gaps between successive such chunks
  double e2e_s = 0;           // to the end of the stream ([DONE])
  int64_t output_tokens = 0;  // usage.completion_tokens of the stream's usage chunk
};

// POSTs `body` (a streaming completion request with include_usage) to /v1/completions and times
// it. Failures are returned in the record, never thrown: a non-2xx reply, a transport error, an
// error payload mid-stream, a stream that ends without [DONE], or no usage chunk.
// Thread-compatible: one `client` per calling thread.
RequestRecord run_stream_request(client::HttpClient& client, const std::string& body);

}  // namespace loom::bench
