// A small blocking HTTP/1.1 client for talking to loom-server (or any OpenAI-compatible server)
// from loom-cli and loom-bench: plain JSON requests and server-sent-event streams. Built on
// Boost.Beast; every network step runs under a deadline so a stalled server cannot hang the
// caller. One connection per request: the callers are command-line tools and a load generator,
// where a loopback connect costs tens of microseconds.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace loom::client {

// Where a server lives: `http://host[:port][/base]`. https is rejected (no TLS in this client).
struct ServerUrl {
  std::string host;
  std::string port = "80";
  std::string base_path;  // without a trailing '/'; prefixed to every request path
};
absl::StatusOr<ServerUrl> parse_server_url(std::string_view url);

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// Turns a non-2xx reply into a Status that carries the server's message (the OpenAI error shape
// `{"error": {"message": ...}}` when present, else the raw body), keyed by HTTP status.
absl::Status status_from_reply(const HttpReply& reply);

// The JSON object a request answered with: its transport error, its HTTP error
// (status_from_reply), DataLoss naming `what` when the body is not a JSON object, else the object.
absl::StatusOr<nlohmann::json> json_object_of(const absl::StatusOr<HttpReply>& reply,
                                              std::string_view what);

struct HttpClientOptions {
  std::string api_key;  // sent as `Authorization: Bearer KEY` when set
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration read_timeout = absl::Seconds(600);  // per read: the gap between two stream pieces
};

class HttpClient {
 public:
  HttpClient(ServerUrl url, HttpClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  absl::StatusOr<HttpReply> get(std::string_view path);
  absl::StatusOr<HttpReply> post_json(std::string_view path, std::string_view body);

  // POSTs `body` and reads the reply as server-sent events, calling `on_data` with each event's
  // data as it arrives. `on_data` returning false closes the connection at once (the server then
  // cancels the request). A non-2xx reply is read whole and returned without calling `on_data`.
  // The returned reply has the status and content type, and an empty body on success.
  using DataCallback = std::function<bool(std::string_view data)>;
  absl::StatusOr<HttpReply> post_sse(std::string_view path, std::string_view body,
                                     const DataCallback& on_data);

 private:
  struct Connection;
  absl::StatusOr<HttpReply> exchange(std::string_view method, std::string_view path,
                                     std::string_view body, const DataCallback* on_data);

  ServerUrl url_;
  HttpClientOptions options_;
};

}  // namespace loom::client
