#include "server/http_session.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "server/http_routes.h"
#include "server/sse_writer.h"

namespace loom {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpContext& ctx)
      : stream_(std::move(socket)),
        ctx_(ctx),
        accepted_(Clock::now()),
        write_timer_(stream_.get_executor()) {
    ctx_.metrics->add_connections(1);
  }
  ~Session() { ctx_.metrics->add_connections(-1); }

  void start() {
    net::dispatch(stream_.get_executor(),
                  [self = shared_from_this()] { self->wait_for_request(); });
  }

 private:
  // ---- reading ----
  void wait_for_request() {
    if (reading_ || closed_) return;
    reading_ = true;
    if (buffer_.size() > 0) return read_header();
    // Until its first request, a connection is on the header clock from accept: a client that
    // connects and sends nothing must not hold a descriptor for the idle timeout.
    if (requests_ == 0) {
      stream_.expires_at(first_request_deadline());
    } else {
      stream_.expires_after(seconds_to_ms(ctx_.options.idle_timeout_s));
    }
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) {
                                self->reading_ = false;
                                return self->close();
                              }
                              self->buffer_.commit(n);
                              self->read_header();
                            });
  }

  void read_header() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(ctx_.options.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(ctx_.options.max_body_bytes));
    request_start_ = Clock::now();
    if (requests_ == 0) {
      stream_.expires_at(first_request_deadline());
    } else {
      stream_.expires_after(seconds_to_ms(ctx_.options.header_timeout_s));
    }
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    if (parser_->content_length() &&
        *parser_->content_length() > static_cast<uint64_t>(ctx_.options.max_body_bytes)) {
      return reject(413, "the request body is larger than --max_body_bytes");
    }
    const auto& req = parser_->get();
    auto expect = req[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) {
                           self->reading_ = false;
                           return self->close();
                         }
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->on_read_error(ec);
                       self->dispatch();
                     });
  }

  void on_read_error(beast::error_code ec) {
    reading_ = false;
    if (ec == http::error::body_limit) {
      return reject(413, "the request body is larger than --max_body_bytes");
    }
    if (ec == http::error::header_limit) {
      return reject(431, "the request headers are larger than --max_header_bytes");
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    reject(400, "malformed HTTP request: " + ec.message());
  }

  // Answers with an error and closes (the request stream is no longer in sync).
  void reject(int status, std::string message) {
    method_ = "-";
    path_ = "-";
    HttpReply r = error_reply(make_api_error(status, std::move(message)));
    ctx_.metrics->on_request_rejected(std::to_string(status));
    log(status, 0, 0);
    keep_alive_ = false;
    send(serialize_reply(r, false));
  }

  Clock::time_point first_request_deadline() const {
    return accepted_ + seconds_to_ms(ctx_.options.header_timeout_s);
  }

  void dispatch() {
    reading_ = false;
    ++requests_;
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    http10_ = req.version() < 11;
    method_ = std::string(req.method_string());
    path_ = std::string(req.target().substr(0, std::min<size_t>(req.target().size(), 200)));
    std::string auth(req[http::field::authorization]);
    auto sv = [](beast::string_view v) { return std::string_view(v.data(), v.size()); };
    HttpRequestView view{sv(req.method_string()), sv(req.target()), auth, req.body()};
    if (auto it = req.find(http::field::host); it != req.end()) {
      view.host = sv(it->value());
      view.has_host = true;
    }
    view.content_type = sv(req[http::field::content_type]);
    RouteResult result = handle_request(ctx_, view);
    if (result.generation) return start_generation(std::move(result.generation));
    if (result.reply.status >= 400) {
      ctx_.metrics->on_request_rejected(std::to_string(result.reply.status));
    }
    log(result.reply.status, 0, 0);
    send(serialize_reply(result.reply, keep_alive_));
    parser_.reset();
    if (keep_alive_) resume_after_write_ = true;
  }

  // ---- generation ----
  void start_generation(std::unique_ptr<Generation> gen) {
    ctx_.in_flight.fetch_add(1);
    gen_ = std::move(gen);
    first_token_seen_ = false;
    parser_.reset();
    open_streams_ = static_cast<int>(gen_->streams.size());
    last_token_.assign(gen_->streams.size() * 64, Clock::time_point());
    if (gen_->stream) {
      // HTTP/1.0 has no chunked coding: the stream ends when the connection closes.
      if (http10_) keep_alive_ = false;
      send(sse_response_head(/*chunked=*/!http10_));
      for (const std::string& p : gen_->stream_head) send_stream(gen_->builder->sse_frame(p));
    }
    for (size_t i = 0; i < gen_->streams.size(); ++i) {
      ctx_.pump->add(gen_->streams[i], [self = shared_from_this(), i](
                                           std::vector<RequestOutput> events, bool closed) {
        net::post(self->stream_.get_executor(),
                  [self, i, events = std::move(events), closed]() mutable {
                    self->on_events(static_cast<int>(i), std::move(events), closed);
                  });
      });
    }
    watch_peer();
  }

  // A read while generating: any error (EOF, reset) means the client left.
  void watch_peer() {
    watching_ = true;
    stream_.expires_never();
    stream_.async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (!ec) {
            self->buffer_.commit(n);  // a pipelined request: parsed after this generation
            if (self->gen_) {
              // A client pipelining more than a body's worth while generating is misbehaving.
              if (self->buffer_.size() > static_cast<size_t>(self->ctx_.options.max_body_bytes)) {
                return self->client_gone();
              }
              return self->watch_peer();
            }
            return self->wait_for_request();
          }
          if (self->gen_) return self->client_gone();
          if (ec == net::error::operation_aborted && self->keep_alive_ && !self->closed_) {
            return self->wait_for_request();  // we cancelled the watch to read the next request
          }
          self->close();
        });
  }

  void on_events(int prompt, std::vector<RequestOutput> events, bool closed) {
    if (!gen_) return;
    const auto now = Clock::now();
    for (RequestOutput& e : events) {
      if (!e.token_ids.empty()) {
        size_t slot = static_cast<size_t>(prompt) * 64 + static_cast<size_t>(e.index & 63);
        if (slot < last_token_.size()) {
          if (last_token_[slot] == Clock::time_point()) {
            if (!first_token_seen_) {
              first_token_seen_ = true;
              ctx_.metrics->observe_ttft(
                  std::chrono::duration<double>(now - gen_->received).count());
            }
          } else {
            double dt = std::chrono::duration<double>(now - last_token_[slot]).count();
            ctx_.metrics->observe_itl(dt / static_cast<double>(e.token_ids.size()));
          }
          last_token_[slot] = now;
        }
      }
      std::vector<std::string> chunks = gen_->builder->on_event(prompt, e);
      if (gen_->stream && !gone_) {
        for (const std::string& c : chunks) send_stream(gen_->builder->sse_frame(c));
      }
    }
    if (closed && --open_streams_ == 0) finish_generation();
  }

  void finish_generation() {
    ResponseRenderer& b = *gen_->builder;
    int status = 200;
    std::string reason = b.last_finish_reason();
    if (gone_) {
      status = 499;  // client closed the connection (nginx's convention), logged only
      reason = "cancelled";
    } else if (gen_->stream) {
      for (const std::string& c : b.stream_tail()) send_stream(b.sse_frame(c));
      if (const std::string end = b.sse_end(); !end.empty()) send_stream(end);
      if (!http10_) send(http_last_chunk());
    } else if (!b.error().empty()) {
      status = 500;
      reason = "error";
      send(serialize_reply(error_reply(make_api_error(500, b.error())), keep_alive_));
    } else {
      send(serialize_reply(json_reply(200, b.final_json()), keep_alive_));
    }
    if (gone_ && status == 200) {  // the pending-bytes cap tripped on the last bytes: not delivered
      status = 499;
      reason = "cancelled";
    }
    if (!b.error().empty()) reason = "error";
    ctx_.metrics->on_request_finished(reason, b.prompt_tokens(), b.completion_tokens());
    ctx_.metrics->observe_e2e(std::chrono::duration<double>(Clock::now() - gen_->received).count());
    log(status, b.prompt_tokens(), b.completion_tokens());
    gen_.reset();
    // in_flight drops once these last bytes are written (after_writes) or the connection closes,
    // so a draining server does not close the connection under them.
    unwritten_generation_ = true;
    if (gone_) return close();
    if (keep_alive_)
      resume_after_write_ = true;
    else
      close_after_write_ = true;
    if (!writing_) after_writes();
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    outbox_.clear();
    for (const auto& s : gen_->streams) ctx_.engine->cancel(s->id());
  }

  // ---- writing ----
  // Bytes of a streamed body, framed as the client's HTTP version allows.
  void send_stream(const std::string& bytes) { send(http10_ ? bytes : http_chunk(bytes)); }

  void send(const std::string& bytes) {
    if (closed_) return;
    outbox_ += bytes;
    if (!writing_) return do_write();
    const size_t pending = outbox_.size() + (writing_buf_.size() - written_);
    if (static_cast<int64_t>(pending) > ctx_.options.max_pending_write_bytes) stalled_reader();
  }

  // The client stopped reading: give up on it as if it had disconnected. Closing the socket
  // aborts the stuck write; the engine frees the request's pages and slot at its next step.
  void stalled_reader() {
    if (closed_) return;
    ctx_.metrics->on_slow_client_disconnect();
    if (gen_) client_gone();
    close();
  }

  void do_write() {
    if (outbox_.empty()) return after_writes();
    writing_ = true;
    writing_buf_ = std::move(outbox_);
    outbox_.clear();
    written_ = 0;
    write_some();
  }

  // One socket write of what is left of writing_buf_, under a fresh deadline: the timeout bounds
  // a stall (no byte accepted for write_timeout_s), not a long reply to a slow but steady reader.
  void write_some() {
    const uint64_t attempt = ++write_attempt_;
    write_timer_.expires_after(seconds_to_ms(ctx_.options.write_timeout_s));
    write_timer_.async_wait([self = shared_from_this(), attempt](beast::error_code ec) {
      // A timer that fired just as its write completed is stale: the next write has its own.
      if (!ec && self->writing_ && attempt == self->write_attempt_) self->stalled_reader();
    });
    stream_.socket().async_write_some(
        net::buffer(writing_buf_.data() + written_, writing_buf_.size() - written_),
        [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->write_timer_.cancel();
          if (ec) {
            self->writing_ = false;
            self->writing_buf_.clear();
            if (self->gen_) return self->client_gone();
            return self->close();
          }
          self->written_ += n;
          if (self->written_ < self->writing_buf_.size()) return self->write_some();
          self->writing_ = false;
          self->writing_buf_.clear();
          self->do_write();
        });
  }

  // Everything queued is written: close, or go back to reading.
  void after_writes() {
    if (!writing_ && unwritten_generation_) generation_written();
    if (gen_ || writing_) return;
    if (close_after_write_ || !keep_alive_) return close();
    if (!resume_after_write_ || reading_) return;
    resume_after_write_ = false;
    if (watching_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // the watch's handler then reads the next request
      return;
    }
    wait_for_request();
  }

  void close() {
    if (unwritten_generation_) generation_written();
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  void generation_written() {
    unwritten_generation_ = false;
    ctx_.in_flight.fetch_sub(1);
  }

  void log(int status, int prompt_tokens, int completion_tokens) {
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - request_start_).count();
    std::string line = absl::StrFormat(
        "http %s %s status=%d prompt_tokens=%d completion_tokens=%d latency_ms=%.1f\n", method_,
        path_, status, prompt_tokens, completion_tokens, ms);
    std::fputs(line.c_str(), stderr);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  HttpContext& ctx_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Clock::time_point request_start_ = Clock::now();
  std::string method_ = "-", path_ = "-";
  bool keep_alive_ = true;
  bool http10_ = false;  // the current request is HTTP/1.0
  const Clock::time_point accepted_;
  uint64_t requests_ = 0;  // requests read on this connection

  net::steady_timer write_timer_;  // bounds each write (see HttpOptions::write_timeout_s)
  std::string outbox_;             // bytes waiting for the current write to finish
  std::string writing_buf_;        // bytes of the write in flight
  size_t written_ = 0;             // of writing_buf_, accepted by the socket so far
  uint64_t write_attempt_ = 0;     // tells a stale write-timer expiry from the current one
  bool writing_ = false;
  bool close_after_write_ = false;
  bool resume_after_write_ = false;
  bool closed_ = false;
  bool reading_ = false;  // a request read (or the wait for one) is in flight

  std::unique_ptr<Generation> gen_;    // the generation in progress, if any
  bool unwritten_generation_ = false;  // finished, its last bytes not yet written
  int open_streams_ = 0;
  bool watching_ = false;
  bool gone_ = false;
  bool first_token_seen_ = false;
  std::vector<Clock::time_point> last_token_;  // per (prompt, choice): for inter-token latency
};

}  // namespace

void start_http_session(tcp::socket socket, HttpContext& ctx) {
  std::make_shared<Session>(std::move(socket), ctx)->start();
}

}  // namespace loom
