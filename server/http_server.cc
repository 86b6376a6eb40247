#include "server/http_server.h"

#include <boost/asio.hpp>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/http_context.h"
#include "server/http_session.h"
#include "server/stream_pump.h"

namespace loom {
namespace {
namespace net = boost::asio;
using tcp = net::ip::tcp;
}  // namespace

// Member order matters: the context outlives the io_context, whose pending handlers own the
// sessions that refer to it.
struct HttpServer::Impl {
  HttpContext ctx;
  std::unique_ptr<StreamPump> pump;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::steady_timer retry{ioc};
  // Keeps run() going while no connection is open (e.g. after the drain closed the acceptor).
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(ioc);
  std::vector<std::thread> threads;
  int port = 0;
  bool stopped = false;

  void accept() {
    acceptor.async_accept(
        net::make_strand(ioc), [this](boost::system::error_code ec, tcp::socket socket) {
          if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
          if (ec) {
            // E.g. EMFILE: keep the listener alive and try again shortly.
            std::fprintf(stderr, "http: accept failed: %s\n", ec.message().c_str());
            retry.expires_after(std::chrono::milliseconds(100));
            retry.async_wait([this](boost::system::error_code) {
              if (acceptor.is_open()) accept();
            });
            return;
          }
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          start_http_session(std::move(socket), ctx);
          accept();
        });
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { stop(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(
    Engine& engine, std::shared_ptr<const Tokenizer> tokenizer, ChatSetup chat, Metrics* metrics,
    const HttpOptions& options, AdmissionGate& admission) {
  auto impl = std::make_unique<Impl>();
  impl->ctx.admission = &admission;
  impl->ctx.engine = &engine;
  impl->ctx.tokenizer = std::move(tokenizer);
  impl->ctx.chat = std::move(chat);
  impl->ctx.metrics = metrics;
  impl->ctx.options = options;
  impl->ctx.started_unix = static_cast<int64_t>(std::time(nullptr));
  impl->ctx.responses = std::make_shared<ResponseStore>(
      options.max_stored_responses, absl::Seconds(options.stored_response_ttl_s));
  impl->pump = std::make_unique<StreamPump>(options.pump_threads);
  impl->ctx.pump = impl->pump.get();

  boost::system::error_code ec;
  auto address = net::ip::make_address(options.host, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--host: ", options.host, ": ", ec.message()));
  tcp::endpoint endpoint(address, static_cast<uint16_t>(options.port));
  auto& acc = impl->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(endpoint, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port, ": ", ec.message()));
  }
  impl->port = acc.local_endpoint().port();
  impl->accept();
  for (int i = 0; i < options.io_threads; ++i) {
    impl->threads.emplace_back([p = impl.get()] { p->ioc.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::begin_drain() {
  impl_->ctx.admission->begin_drain();
  impl_->ctx.draining = true;
}

int64_t HttpServer::in_flight() const { return impl_->ctx.in_flight.load(); }

StreamPump& HttpServer::pump() { return *impl_->pump; }

void HttpServer::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  impl_->pump->stop();  // no more posts from pump threads
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);  // no I/O thread is left to race with
}

}  // namespace loom
