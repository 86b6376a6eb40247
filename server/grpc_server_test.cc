// GrpcServer on a real Engine (fixture kimi_linear_s1, byte-level tokenizer) through the C++ stub:
// validation errors arrive as INVALID_ARGUMENT naming the field and leave nothing in the engine;
// a stream ends with one final message carrying usage; cancelling a call (also one whose client
// stopped reading) frees every page and slot; shutdown() drains with UNAVAILABLE.
#include "server/grpc_server.h"

#include <chrono>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "loom/v1/loom.grpc.pb.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::load(kFixtures + "/kimi_linear_s1");
    ASSERT_TRUE(model.ok()) << model.status();
    tokenizer_ = Tokenizer::byte_level();
    EngineOptions eo;
    eo.cache_budget_bytes = int64_t{256} << 20;
    auto engine = Engine::create(std::move(*model), tokenizer_, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto server = GrpcServer::start(*engine_, tokenizer_, "s1", nullptr, {});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Loom::NewStub(channel_);
    initial_ = engine_->stats();
  }
  void TearDown() override {
    if (server_) server_->shutdown();
    if (engine_) engine_->shutdown();
  }

  // Waits (bounded) until the engine holds nothing; expects the pools back at their start.
  // Engine stats are a snapshot published once per engine step, while events reach the client
  // during the step: wait for the snapshot rather than read it once.
  template <class Pred>
  bool stats_reach(Pred pred) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!pred(engine_->stats())) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  void expect_released() {
    engine_->wait_idle();  // every request closed and the stats published after it
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    EngineStats st;
    do {
      st = engine_->stats();
      if (st.running + st.waiting == 0 && st.pages_free == initial_.pages_free &&
          st.slots_free == initial_.slots_free)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    ADD_FAILURE() << "pools not released: pages " << st.pages_free << "/" << initial_.pages_free
                  << ", slots " << st.slots_free << "/" << initial_.slots_free << ", running "
                  << st.running << ", waiting " << st.waiting;
  }

  static void set_deadline(grpc::ClientContext* ctx, int seconds = 60) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Loom::Stub> stub_;
  EngineStats initial_;
};

TEST_F(GrpcServerTest, BadSamplingIsInvalidArgument) {
  struct Case {
    const char* field;
    void (*set)(v1::GenerateRequest*);
  };
  const Case cases[] = {
      {"temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-2); }},
      {"top_p", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"top_k", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_k(-3); }},
      {"max_tokens", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_max_tokens(0); }},
      {"logprobs", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_logprobs(99); }},
      {"n", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_n(100); }},
      {"stop",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 20; ++i) r->mutable_sampling()->add_stop("s");
       }},
      {"token_ids", [](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(100000); }},
      {"prompt", [](v1::GenerateRequest* r) { r->clear_text(); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req;
    req.set_text("hello");
    c.set(&req);
    grpc::ClientContext ctx;
    set_deadline(&ctx);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    EXPECT_FALSE(reader->Read(&resp)) << c.field;
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(st.error_message().find(c.field), std::string::npos)
        << c.field << ": " << st.error_message();
  }
  EXPECT_EQ(engine_->stats().prompt_tokens, 0) << "a rejected request reached the engine";
}

TEST_F(GrpcServerTest, StreamsToOneFinalMessage) {
  v1::GenerateRequest req;
  req.set_text("Loom");
  req.mutable_sampling()->set_max_tokens(10);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(0);
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0, finals = 0, logprobs = 0;
  while (reader->Read(&resp)) {
    EXPECT_EQ(finals, 0) << "a message after the final one";
    tokens += resp.token_ids_size();
    logprobs += resp.logprobs_size();
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finals;
      EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(resp.usage().prompt_tokens(), 4);
      EXPECT_EQ(resp.usage().completion_tokens(), 10);
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(tokens, 10);
  EXPECT_EQ(logprobs, 10);
  expect_released();
}

TEST_F(GrpcServerTest, CancelFreesPagesAndSlot) {
  v1::GenerateRequest req;
  req.set_text("cancel");
  req.mutable_sampling()->set_max_tokens(100000);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_TRUE(stats_reach([](const EngineStats& s) { return s.running == 1; }));
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  expect_released();
  EXPECT_EQ(engine_->stats().finished_cancelled, 1);
}

// A client that stops reading: flow control stalls the writes, the engine keeps the events; a
// cancel still ends the request and frees everything.
TEST_F(GrpcServerTest, StalledReaderCancels) {
  v1::GenerateRequest req;
  req.set_text("stall");
  req.mutable_sampling()->set_max_tokens(100000);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(20);  // big messages fill the flow-control window fast
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // not reading
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  expect_released();
}

TEST_F(GrpcServerTest, ShutdownDrainsWithUnavailable) {
  v1::GenerateRequest req;
  req.set_text("drain");
  req.mutable_sampling()->set_max_tokens(100000);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  std::thread reading([&] {
    while (reader->Read(&resp)) {
    }
  });
  server_->shutdown();  // waits the grace period, then ends the stream
  reading.join();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  expect_released();
  server_->shutdown();  // idempotent
  // New calls fail (the server no longer listens).
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::GetModelInfoResponse info;
  EXPECT_FALSE(stub_->GetModelInfo(&ctx2, v1::GetModelInfoRequest(), &info).ok());
}

TEST_F(GrpcServerTest, TokenizerRpcs) {
  grpc::ClientContext c1;
  v1::TokenizeRequest treq;
  treq.set_text("h\xc3\xa9");
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub_->Tokenize(&c1, treq, &tresp).ok());
  ASSERT_EQ(tresp.token_ids_size(), 3);
  grpc::ClientContext c2;
  v1::DetokenizeRequest dreq;
  dreq.mutable_token_ids()->CopyFrom(tresp.token_ids());
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(stub_->Detokenize(&c2, dreq, &dresp).ok());
  EXPECT_EQ(dresp.text(), "h\xc3\xa9");
  grpc::ClientContext c3;
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(stub_->GetModelInfo(&c3, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "s1");
  EXPECT_EQ(info.vocab_size(), 500);
  EXPECT_EQ(info.tokenizer_vocab_size(), 260);
}

}  // namespace
}  // namespace loom
