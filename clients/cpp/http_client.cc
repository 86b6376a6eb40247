#include "clients/cpp/http_client.h"

#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "clients/cpp/sse_reader.h"
#include "nlohmann/json.hpp"

namespace loom::client {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Replies read whole (errors, JSON) larger than this are refused rather than buffered.
constexpr size_t kMaxReplyBytes = 256 << 20;

std::chrono::steady_clock::duration to_chrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

// Debian's Abseil has its own string_view type; StrCat and friends take it, not std::string_view.
absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

absl::Status network_error(std::string_view what, const beast::error_code& ec) {
  if (ec == beast::error::timeout)
    return absl::DeadlineExceededError(absl::StrCat(av(what), ": timed out"));
  return absl::UnavailableError(absl::StrCat(av(what), ": ", ec.message()));
}

absl::StatusCode code_of_http_status(int status) {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 503:
      return absl::StatusCode::kUnavailable;
    default:
      return status >= 500 ? absl::StatusCode::kInternal : absl::StatusCode::kUnknown;
  }
}

}  // namespace

absl::StatusOr<ServerUrl> parse_server_url(std::string_view url) {
  std::string_view rest = url;
  if (rest.starts_with("https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("url ", av(url), ": https is not supported by this client; use http://"));
  }
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  ServerUrl out;
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash);
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    out.base_path = std::string(path);
  }
  if (authority.empty())
    return absl::InvalidArgumentError(absl::StrCat("url ", av(url), ": no host"));
  std::string_view host = authority;
  std::string_view port;
  if (authority.front() == '[') {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("url ", av(url), ": unterminated IPv6 address"));
    }
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        return absl::InvalidArgumentError(absl::StrCat("url ", av(url), ": bad port"));
      port = after.substr(1);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("url ", av(url), ": no host"));
  if (!port.empty()) {
    int p = 0;
    if (!absl::SimpleAtoi(av(port), &p) || p < 1 || p > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("url ", av(url), ": port must be 1..65535"));
    }
    out.port = std::string(port);
  }
  out.host = std::string(host);
  return out;
}

absl::Status status_from_reply(const HttpReply& reply) {
  if (reply.status >= 200 && reply.status < 300) return absl::OkStatus();
  std::string message;
  nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string()) {
    message = j["error"]["message"].get<std::string>();
  } else {
    message = std::string(absl::StripAsciiWhitespace(reply.body.substr(0, 1000)));
  }
  return absl::Status(code_of_http_status(reply.status),
                      absl::StrCat("HTTP ", reply.status, ": ", message));
}

absl::StatusOr<nlohmann::json> json_object_of(const absl::StatusOr<HttpReply>& reply,
                                              std::string_view what) {
  if (!reply.ok()) return reply.status();
  if (absl::Status s = status_from_reply(*reply); !s.ok()) return s;
  nlohmann::json j = nlohmann::json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::DataLossError(absl::StrCat(av(what), ": the reply is not a JSON object"));
  }
  return j;
}

struct HttpClient::Connection {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;

  // Runs one asynchronous Beast operation to completion on this thread (the deadline set on the
  // stream bounds it) and returns its error code.
  template <class Start>
  beast::error_code run(Start start) {
    beast::error_code result;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.close();
  }
};

HttpClient::HttpClient(ServerUrl url, HttpClientOptions options)
    : url_(std::move(url)), options_(std::move(options)) {}

HttpClient::~HttpClient() = default;

absl::StatusOr<HttpReply> HttpClient::get(std::string_view path) {
  return exchange("GET", path, "", nullptr);
}

absl::StatusOr<HttpReply> HttpClient::post_json(std::string_view path, std::string_view body) {
  return exchange("POST", path, body, nullptr);
}

absl::StatusOr<HttpReply> HttpClient::post_sse(std::string_view path, std::string_view body,
                                               const DataCallback& on_data) {
  return exchange("POST", path, body, &on_data);
}

absl::StatusOr<HttpReply> HttpClient::exchange(std::string_view method, std::string_view path,
                                               std::string_view body, const DataCallback* on_data) {
  Connection c;
  const std::string where = absl::StrCat(url_.host, ":", url_.port);

  beast::error_code ec;
  tcp::resolver resolver(c.ioc);
  auto endpoints = resolver.resolve(url_.host, url_.port, ec);
  if (ec) return network_error(absl::StrCat("resolve ", where), ec);
  c.stream.expires_after(to_chrono(options_.connect_timeout));
  ec = c.run([&](auto handler) { c.stream.async_connect(endpoints, handler); });
  if (ec) return network_error(absl::StrCat("connect to ", where), ec);

  http::request<http::string_body> req;
  req.method(method == "GET" ? http::verb::get : http::verb::post);
  req.target(absl::StrCat(url_.base_path, av(path)));
  req.version(11);
  // RFC 9110 7.2: the port unless it is the default, IPv6 literals in brackets.
  std::string host =
      url_.host.find(':') != std::string::npos ? absl::StrCat("[", url_.host, "]") : url_.host;
  if (url_.port != "80") absl::StrAppend(&host, ":", url_.port);
  req.set(http::field::host, host);
  req.set(http::field::user_agent, "loom-client/0.1");
  req.keep_alive(false);
  if (!options_.api_key.empty()) {
    req.set(http::field::authorization, absl::StrCat("Bearer ", options_.api_key));
  }
  if (method != "GET") {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(body);
    req.prepare_payload();
  }
  if (on_data != nullptr) req.set(http::field::accept, "text/event-stream");

  c.stream.expires_after(to_chrono(options_.read_timeout));
  ec = c.run([&](auto handler) { http::async_write(c.stream, req, handler); });
  if (ec) return network_error(absl::StrCat("send to ", where), ec);

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  c.stream.expires_after(to_chrono(options_.read_timeout));
  ec = c.run([&](auto handler) { http::async_read_header(c.stream, c.buffer, parser, handler); });
  if (ec) return network_error(absl::StrCat("read reply from ", where), ec);

  HttpReply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.content_type = std::string(parser.get()[http::field::content_type]);
  const bool stream_events = on_data != nullptr && reply.status >= 200 && reply.status < 300;

  SseReader sse;
  bool stopped = false;
  absl::Status sse_status;
  auto on_event = [&](const SseEvent& e) {
    if (!stopped && !(*on_data)(e.data)) stopped = true;
  };
  char piece[16 << 10];
  while (!parser.is_done() && !stopped) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    c.stream.expires_after(to_chrono(options_.read_timeout));
    ec = c.run([&](auto handler) { http::async_read_some(c.stream, c.buffer, parser, handler); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return network_error(absl::StrCat("read reply from ", where), ec);
    size_t n = sizeof piece - parser.get().body().size;
    if (stream_events) {
      sse_status = sse.feed(std::string_view(piece, n), on_event);
      if (!sse_status.ok()) return sse_status;
    } else {
      if (reply.body.size() + n > kMaxReplyBytes) {
        return absl::ResourceExhaustedError(
            absl::StrCat("reply from ", where, " exceeds ", kMaxReplyBytes, " bytes"));
      }
      reply.body.append(piece, n);
    }
  }
  c.close();
  return reply;
}

}  // namespace loom::client
