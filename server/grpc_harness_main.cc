// loom-grpc-harness: serves one model over gRPC only (no HTTP), for the gRPC integration tests and
// for trying the API with grpcurl. Prints "loom-server: grpc listening on HOST:PORT" once bound
// (the same line as loom-server) and runs until stdin closes or SIGINT/SIGTERM, then drains as
// loom-server does: NOT_SERVING and new calls refused at once, live streams get --drain_timeout_s.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/engine.h"
#include "server/chat_setup.h"
#include "server/grpc_server.h"
#include "server/metrics.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json + safetensors)");
ABSL_FLAG(std::string, host, "127.0.0.1", "gRPC listen address");
ABSL_FLAG(int, grpc_port, 0, "gRPC port (0: any free port)");
ABSL_FLAG(int64_t, cache_budget_mb, 256, "KV pages + state slots, MiB");
ABSL_FLAG(int, max_num_seqs, 16, "sequences per step");
ABSL_FLAG(std::string, api_key, "", "require metadata authorization: Bearer KEY");
ABSL_FLAG(int, max_queue, 256, "requests admitted beyond max_num_seqs (RESOURCE_EXHAUSTED)");
ABSL_FLAG(double, drain_timeout_s, 30, "on a signal, seconds live streams get to finish");

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_model);
  auto model = loom::Model::load(dir);
  if (!model.ok()) {
    std::cerr << "loom-grpc-harness: " << model.status() << "\n";
    return 1;
  }
  std::shared_ptr<const loom::Tokenizer> tokenizer;
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    auto t = loom::Tokenizer::from_file(dir + "/tokenizer.json");
    if (!t.ok()) {
      std::cerr << "loom-grpc-harness: " << t.status() << "\n";
      return 1;
    }
    tokenizer = std::move(*t);
  } else if ((*model)->config().vocab_size >= 260) {
    tokenizer = loom::Tokenizer::byte_level();  // small bundled models: ids 0..259
  }
  // Chat renders and reads as loom-server does: the folder's own template, else the family's.
  auto chat = loom::load_chat_setup(dir, (*model)->config().model_type,
                                    loom::ReasoningParser::kAuto, tokenizer.get());
  if (!chat.ok()) {
    std::cerr << "loom-grpc-harness: " << chat.status() << "\n";
    return 1;
  }
  loom::EngineOptions eo;
  eo.cache_budget_bytes = absl::GetFlag(FLAGS_cache_budget_mb) << 20;
  eo.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  auto engine = loom::Engine::create(std::move(*model), tokenizer, eo);
  if (!engine.ok()) {
    std::cerr << "loom-grpc-harness: " << engine.status() << "\n";
    return 1;
  }
  loom::Metrics metrics;
  loom::GrpcServerOptions go;
  go.host = absl::GetFlag(FLAGS_host);
  go.port = absl::GetFlag(FLAGS_grpc_port);
  go.api_key = absl::GetFlag(FLAGS_api_key);
  go.max_running = eo.max_num_seqs;
  go.max_queue = absl::GetFlag(FLAGS_max_queue);
  go.chat = *std::move(chat);
  auto server = loom::GrpcServer::start(
      **engine, tokenizer, std::filesystem::path(dir).filename().string(), &metrics, go);
  if (!server.ok()) {
    std::cerr << "loom-grpc-harness: " << server.status() << "\n";
    return 1;
  }
  std::printf("loom-server: grpc listening on %s:%d\n", go.host.c_str(), (*server)->port());
  std::fflush(stdout);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  // Stdin closing (the test runner went away) also stops us, so no orphan outlives its test.
  std::thread([] {
    while (std::getchar() != EOF) {
    }
    g_stop = 1;
  }).detach();
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (*server)->begin_drain();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(absl::GetFlag(FLAGS_drain_timeout_s));
  while ((*server)->in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  (*server)->shutdown();
  (*engine)->shutdown();
  std::fputs(metrics.render((*engine)->stats()).c_str(), stderr);
  return 0;
}
