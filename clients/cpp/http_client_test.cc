#include "clients/cpp/http_client.h"

#include <atomic>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/read_until.hpp"
#include "boost/asio/streambuf.hpp"
#include "boost/asio/write.hpp"
#include "gtest/gtest.h"

namespace loom::client {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A one-connection scripted HTTP server on a loopback port: it reads one request (head and a
// Content-Length body), then runs `script` with the socket to write whatever reply a test needs.
class ScriptedServer {
 public:
  using Script = std::function<void(tcp::socket&)>;

  explicit ScriptedServer(Script script)
      : acceptor_(ioc_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, script = std::move(script)] {
      boost::system::error_code ec;
      tcp::socket socket(ioc_);
      acceptor_.accept(socket, ec);
      if (ec) return;
      asio::streambuf buf;
      size_t head_len = asio::read_until(socket, buf, "\r\n\r\n", ec);
      if (ec) return;
      std::string all(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data()));
      std::string head = all.substr(0, head_len);
      size_t content_length = 0;
      if (auto p = head.find("Content-Length: "); p != std::string::npos) {
        content_length = std::stoul(head.substr(p + 16));
      }
      std::string body = all.substr(head_len);
      if (body.size() < content_length) {
        std::string rest(content_length - body.size(), '\0');
        asio::read(socket, asio::buffer(rest), ec);
        body += rest;
      }
      request_head_ = head;
      request_body_ = body;
      script(socket);
    });
  }
  ~ScriptedServer() {
    if (thread_.joinable()) thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void join() { thread_.join(); }
  const std::string& request_head() const { return request_head_; }
  const std::string& request_body() const { return request_body_; }

 private:
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  int port_;
  std::thread thread_;
  std::string request_head_, request_body_;
};

void write_all(tcp::socket& s, std::string_view bytes) {
  boost::system::error_code ec;
  asio::write(s, asio::buffer(bytes.data(), bytes.size()), ec);
}

HttpClient client_for(const std::string& url, HttpClientOptions options = {}) {
  auto u = parse_server_url(url);
  EXPECT_TRUE(u.ok()) << u.status();
  return HttpClient(*u, options);
}

TEST(ServerUrl, Parses) {
  auto a = parse_server_url("http://localhost:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "localhost");
  EXPECT_EQ(a->port, "8000");
  EXPECT_EQ(a->base_path, "");
  auto b = parse_server_url("example.com/api/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "example.com");
  EXPECT_EQ(b->port, "80");
  EXPECT_EQ(b->base_path, "/api");
  auto c = parse_server_url("http://[::1]:9000/x");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, "9000");
  EXPECT_EQ(c->base_path, "/x");
  for (const char* bad : {"https://h", "http://", "http://h:0", "http://h:70000", "http://h:x",
                          "http://[::1", "http://:80"}) {
    EXPECT_FALSE(parse_server_url(bad).ok()) << bad;
  }
}

TEST(StatusFromReply, CarriesTheServersMessage) {
  EXPECT_TRUE(status_from_reply({200, "", "{}"}).ok());
  absl::Status s = status_from_reply(
      {400, "application/json", R"({"error":{"message":"max_tokens: must be >= 1","type":"x"}})"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "HTTP 400: max_tokens: must be >= 1");
  EXPECT_EQ(status_from_reply({401, "", "{}"}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(status_from_reply({429, "", "busy"}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status_from_reply({429, "", "busy"}).message(), "HTTP 429: busy");
  EXPECT_EQ(status_from_reply({503, "", ""}).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status_from_reply({500, "", ""}).code(), absl::StatusCode::kInternal);
}

TEST(HttpClient, PostsJsonWithHeadersAndReadsTheReply) {
  ScriptedServer server([](tcp::socket& s) {
    write_all(s,
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
              "{\"ok\":true}");
  });
  HttpClientOptions options;
  options.api_key = "sekret";
  auto u = parse_server_url(server.url() + "/base");
  ASSERT_TRUE(u.ok());
  HttpClient client(*u, options);
  auto reply = client.post_json("/v1/completions", R"({"prompt":"x"})");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->content_type, "application/json");
  EXPECT_EQ(reply->body, "{\"ok\":true}");
  server.join();
  EXPECT_EQ(server.request_head().rfind("POST /base/v1/completions HTTP/1.1\r\n", 0), 0u)
      << server.request_head();
  EXPECT_NE(server.request_head().find("Authorization: Bearer sekret\r\n"), std::string::npos);
  EXPECT_NE(server.request_head().find("Host: 127.0.0.1:" + server.url().substr(17) + "\r\n"),
            std::string::npos)
      << server.request_head();
  EXPECT_NE(server.request_head().find("Content-Type: application/json\r\n"), std::string::npos);
  EXPECT_EQ(server.request_body(), R"({"prompt":"x"})");
}

TEST(HttpClient, StreamsEventsAsTheyArrive) {
  // The server sends the first event, then waits until the client has seen it before sending the
  // rest: a client that buffered the whole reply would deadlock (and fail on the timeout).
  std::promise<void> first_seen;
  auto first_seen_future = first_seen.get_future();
  ScriptedServer server([&](tcp::socket& s) {
    write_all(s,
              "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
              "Transfer-Encoding: chunked\r\n\r\n");
    write_all(s, "e\r\ndata: {\"a\":1}\n\r\n");
    write_all(s, "1\r\n\n\r\n");  // the blank line that ends event 1, in its own HTTP chunk
    first_seen_future.wait_for(std::chrono::seconds(10));
    // Event 2 split mid-line across chunks, then [DONE] and the last chunk.
    write_all(s, "7\r\ndata: {\r\n");
    write_all(s, "8\r\n\"b\":2}\n\n\r\n");
    write_all(s, "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
  });
  HttpClientOptions options;
  options.read_timeout = absl::Seconds(5);
  HttpClient client = client_for(server.url(), options);
  std::vector<std::string> events;
  auto reply = client.post_sse("/v1/completions", "{}", [&](std::string_view data) {
    events.emplace_back(data);
    if (events.size() == 1) first_seen.set_value();
    return true;
  });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(events, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
  server.join();
  EXPECT_NE(server.request_head().find("Accept: text/event-stream\r\n"), std::string::npos);
}

TEST(HttpClient, StoppingAStreamClosesTheConnection) {
  std::atomic<bool> server_saw_close{false};
  ScriptedServer server([&](tcp::socket& s) {
    write_all(s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    write_all(s, "a\r\ndata: 1\n\n\r\n");
    // Keep the stream open; the client hangs up after the first event.
    char byte;
    boost::system::error_code ec;
    s.read_some(asio::buffer(&byte, 1), ec);
    server_saw_close = static_cast<bool>(ec);  // EOF or reset
  });
  HttpClient client = client_for(server.url());
  int calls = 0;
  auto reply = client.post_sse("/x", "{}", [&](std::string_view) {
    ++calls;
    return false;
  });
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(calls, 1);
  server.join();
  EXPECT_TRUE(server_saw_close.load());
}

TEST(HttpClient, ErrorReplyToAStreamIsReadWhole) {
  ScriptedServer server([](tcp::socket& s) {
    std::string body = R"({"error":{"message":"queue full","type":"rate_limit_error"}})";
    write_all(s,
              "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
              "Content-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  });
  HttpClient client = client_for(server.url());
  bool called = false;
  auto reply = client.post_sse("/x", "{}", [&](std::string_view) { return called = true; });
  ASSERT_TRUE(reply.ok());
  EXPECT_FALSE(called);
  absl::Status s = status_from_reply(*reply);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "HTTP 429: queue full");
}

TEST(HttpClient, StalledServerTimesOut) {
  std::promise<void> release;
  auto released = release.get_future();
  ScriptedServer server([&](tcp::socket&) { released.wait_for(std::chrono::seconds(10)); });
  HttpClientOptions options;
  options.read_timeout = absl::Milliseconds(200);
  HttpClient client = client_for(server.url(), options);
  auto reply = client.get("/health");
  release.set_value();
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
}

TEST(HttpClient, RefusedConnectionIsUnavailable) {
  int port;
  {
    asio::io_context ioc;
    tcp::acceptor a(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }  // closed again: nothing listens there now
  HttpClient client = client_for("http://127.0.0.1:" + std::to_string(port));
  auto reply = client.get("/health");
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
}

TEST(HttpClient, TruncatedReplyIsAnError) {
  ScriptedServer server([](tcp::socket& s) {
    write_all(s, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little");
    s.close();
  });
  HttpClient client = client_for(server.url());
  auto reply = client.get("/v1/models");
  EXPECT_FALSE(reply.ok());
}

}  // namespace
}  // namespace loom::client
