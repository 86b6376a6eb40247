// GrpcServer on a real Engine (fixture kimi_linear_s1, byte-level tokenizer) through the C++ stub:
// validation errors arrive as INVALID_ARGUMENT naming the field and leave nothing in the engine;
// a stream ends with one final message carrying usage; cancelling a call (also one whose client
// stopped reading) frees every page and slot; the API key guards every method but health; the
// admission gate admits exactly max_running + max_queue streams; a request that does not parse is
// INVALID_ARGUMENT; begin_drain() refuses new work while live streams finish, and shutdown() ends
// the rest with UNAVAILABLE.
#include "server/grpc_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/chat/chat_template.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "loom/v1/loom.grpc.pb.h"

namespace loom {
namespace {

// The unknown-field set of `m`, to add fields a newer loom.v1 would have.
google::protobuf::UnknownFieldSet* unknown_fields(google::protobuf::Message* m) {
  return m->GetReflection()->MutableUnknownFields(m);
}

const std::string kFixtures = LOOM_FIXTURES_DIR;

// The engine's --max_n, below kMaxN: GetModelInfo must report it.
constexpr int kServerMaxN = 3;

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::load(kFixtures + "/kimi_linear_s1");
    ASSERT_TRUE(model.ok()) << model.status();
    tokenizer_ = Tokenizer::byte_level();
    EngineOptions eo;
    eo.cache_budget_bytes = int64_t{256} << 20;
    const GrpcServerOptions options = server_options();
    eo.max_num_seqs = options.max_running;
    eo.max_n = kServerMaxN;
    auto engine = Engine::create(std::move(*model), tokenizer_, eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto server = GrpcServer::start(*engine_, tokenizer_, "s1", nullptr, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Loom::NewStub(channel_);
    initial_ = engine_->stats();
  }
  virtual GrpcServerOptions server_options() { return {}; }

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

  // A unary call of `method` with raw request bytes: the status and the response bytes.
  std::pair<grpc::Status, std::string> raw_call(const std::string& method,
                                                const std::string& bytes) {
    grpc::GenericStub generic(channel_);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    set_deadline(&ctx);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status st) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(st);
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }))
      return {grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer"), ""};
    std::string out;
    std::vector<grpc::Slice> slices;
    if (status.ok() && response.Dump(&slices).ok())
      for (const grpc::Slice& s : slices)
        out.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return {status, out};
  }

  // grpc.health.v1 Check of `service` (no C++ stubs for it here: its two messages are one field
  // each, written by hand): "SERVING", "NOT_SERVING", or the failed call's status code.
  std::string health(const std::string& service) {
    std::string req;
    if (!service.empty()) req = std::string("\x0a") + static_cast<char>(service.size()) + service;
    auto [st, resp] = raw_call("/grpc.health.v1.Health/Check", req);
    if (!st.ok()) return "code " + std::to_string(st.error_code());
    if (resp == std::string("\x08\x01", 2)) return "SERVING";
    if (resp == std::string("\x08\x02", 2)) return "NOT_SERVING";
    return "unexpected response";
  }

  // A one-message chat of two tokens at most.
  static v1::ChatRequest hi_chat() {
    v1::ChatRequest req;
    v1::ChatMessage* m = req.add_messages();
    m->set_role("user");
    m->set_content("hi");
    req.mutable_sampling()->set_max_tokens(2);
    return req;
  }

  // Runs a Chat call to its end: the messages and the final status.
  std::pair<std::vector<v1::ChatResponse>, grpc::Status> chat(const v1::ChatRequest& req) {
    grpc::ClientContext ctx;
    set_deadline(&ctx);
    auto reader = stub_->Chat(&ctx, req);
    std::vector<v1::ChatResponse> out;
    v1::ChatResponse resp;
    while (reader->Read(&resp)) out.push_back(resp);
    return {out, reader->Finish()};
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
      // HTTP's limit too: one validation (SamplingParams) for both frontends.
      {"temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(3); }},
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
  req.mutable_sampling()->set_max_tokens(10000);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp)) << reader->Finish().error_message();
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
  req.mutable_sampling()->set_max_tokens(10000);
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
  req.mutable_sampling()->set_max_tokens(10000);
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
  const auto t0 = std::chrono::steady_clock::now();
  server_->shutdown();  // the drain timeout passed (loom-server's): ends the stream at once
  reading.join();
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("drain timeout"), std::string::npos) << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
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
  EXPECT_EQ(info.max_n(), kServerMaxN);  // the engine's limit, not kMaxN
  EXPECT_EQ(info.max_logprobs(), kMaxLogprobs);
}

// A newer client's field (a number this server's loom.v1 lacks) is INVALID_ARGUMENT naming its
// number and where it is, on Generate (top level and inside sampling) and the unary methods,
// and never reaches the engine.
TEST_F(GrpcServerTest, UnknownFieldsAreInvalidArgument) {
  v1::GenerateRequest top;
  top.mutable_token_ids()->add_ids(1);
  unknown_fields(&top)->AddVarint(99, 1);
  v1::GenerateRequest nested;
  nested.mutable_token_ids()->add_ids(1);
  nested.mutable_sampling()->set_max_tokens(2);
  unknown_fields(nested.mutable_sampling())->AddVarint(40, 7);
  v1::TokenizeRequest tok;
  tok.set_text("hi");
  unknown_fields(&tok)->AddLengthDelimited(12, "x");
  const std::pair<const char*, std::string> cases[] = {
      {"/loom.v1.Loom/Generate", top.SerializeAsString()},
      {"/loom.v1.Loom/Generate", nested.SerializeAsString()},
      {"/loom.v1.Loom/Tokenize", tok.SerializeAsString()},
  };
  const char* expected[] = {"loom.v1.GenerateRequest: unknown field number 99",
                            "sampling: unknown field number 40",
                            "loom.v1.TokenizeRequest: unknown field number 12"};
  for (size_t i = 0; i < 3; ++i) {
    const grpc::Status st = raw_call(cases[i].first, cases[i].second).first;
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(expected[i]), std::string::npos) << st.error_message();
  }
  EXPECT_EQ(engine_->stats().prompt_tokens, 0);
  EXPECT_EQ(server_->in_flight(), 0);
}

// A request whose bytes are not the method's message: the client's error, INVALID_ARGUMENT
// (typed callback handlers would answer UNIMPLEMENTED).
TEST_F(GrpcServerTest, MalformedProtobufIsInvalidArgument) {
  const std::string garbage = "\xff\xff\xff\xff\x0f";  // a field tag with no valid wire type
  for (const char* method :
       {"/loom.v1.Loom/Generate", "/loom.v1.Loom/DeleteSession", "/loom.v1.Loom/Tokenize",
        "/loom.v1.Loom/Detokenize", "/loom.v1.Loom/GetStats"}) {
    const grpc::Status st = raw_call(method, garbage).first;
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << st.error_message();
  }
  EXPECT_EQ(server_->in_flight(), 0);
}

// begin_drain(): health NOT_SERVING and new calls UNAVAILABLE at once, while a live stream runs
// to its end with its final message.
TEST_F(GrpcServerTest, DrainRefusesNewWorkAndLetsLiveStreamsFinish) {
  v1::GenerateRequest req;
  req.set_text("drain");
  req.mutable_sampling()->set_max_tokens(300);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  set_deadline(&ctx);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  int tokens = resp.token_ids_size();
  EXPECT_EQ(health(""), "SERVING");
  server_->begin_drain();

  EXPECT_EQ(health(""), "NOT_SERVING");
  EXPECT_EQ(health("loom.v1.Loom"), "NOT_SERVING");
  grpc::ClientContext c2;
  set_deadline(&c2);
  auto refused = stub_->Generate(&c2, req);
  EXPECT_FALSE(refused->Read(&resp));
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext c4;
  set_deadline(&c4);
  auto refused_chat = stub_->Chat(&c4, hi_chat());
  v1::ChatResponse chat_resp;
  EXPECT_FALSE(refused_chat->Read(&chat_resp));
  EXPECT_EQ(refused_chat->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext c3;
  set_deadline(&c3);
  v1::TokenizeResponse tresp;
  v1::TokenizeRequest treq;
  treq.set_text("x");
  EXPECT_EQ(stub_->Tokenize(&c3, treq, &tresp).error_code(), grpc::StatusCode::UNAVAILABLE);

  bool final_seen = false;
  while (reader->Read(&resp)) {
    tokens += resp.token_ids_size();
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) final_seen = true;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(final_seen);
  EXPECT_EQ(tokens, 300);
  EXPECT_EQ(server_->in_flight(), 0);
}

// A chat with a tool streams the reply as content (the untrained model writes no call) to one
// final message with usage and logprobs; the prompt is the native template's rendering, tools
// included (its tokens counted in usage equal the template's own rendering).
TEST_F(GrpcServerTest, ChatStreamsToOneFinalMessage) {
  v1::ChatRequest req = hi_chat();
  v1::Tool* tool = req.add_tools();
  tool->set_name("get_time");
  tool->set_parameters(R"({"type": "object", "properties": {}})");
  req.mutable_sampling()->set_max_tokens(6);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_logprobs(1);
  auto [messages, status] = chat(req);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(messages.empty());
  int tokens = 0, logprobs = 0, finals = 0;
  std::string content;
  for (const v1::ChatResponse& m : messages) {
    EXPECT_EQ(finals, 0) << "a message after the final one";
    tokens += m.token_ids_size();
    logprobs += m.logprobs_size();
    content += m.content();
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finals;
      EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(m.usage().completion_tokens(), 6);
      std::vector<ChatMessage> conv(1);
      conv[0].role = "user";
      conv[0].content = "hi";
      std::vector<ToolDefinition> tools(1);
      tools[0].name = "get_time";
      tools[0].parameters_json = R"({"type": "object", "properties": {}})";
      auto rendered = render_chat_prompt(ChatFormat::kNative, conv, tools, RenderOptions());
      ASSERT_TRUE(rendered.ok());
      EXPECT_EQ(m.usage().prompt_tokens(), static_cast<int>(rendered->text.size()))
          << "byte-level: one token per byte of the rendered prompt";
    }
  }
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(tokens, 6);
  EXPECT_EQ(logprobs, 6);
  // Not expect_released(): the rendered prompt fills a 64-token block, which the prefix cache
  // keeps (with its state checkpoint) for the next turn.
  engine_->wait_idle();
  EXPECT_TRUE(stats_reach([](const EngineStats& st) { return st.running + st.waiting == 0; }));
}

// Invalid chats are INVALID_ARGUMENT with HTTP's words, and reach nothing in the engine; too
// long a prompt is refused by the engine's own check (as over HTTP).
TEST_F(GrpcServerTest, BadChatIsInvalidArgument) {
  struct Case {
    const char* names;
    void (*set)(v1::ChatRequest*);
  };
  const Case cases[] = {
      {"messages[0].role", [](v1::ChatRequest* r) { r->mutable_messages(0)->set_role("robot"); }},
      {"messages[1].tool_call_id",
       [](v1::ChatRequest* r) {
         v1::ChatMessage* m = r->add_messages();
         m->set_role("tool");
         m->set_content("22C");
       }},
      {"tools",
       [](v1::ChatRequest* r) {
         v1::Tool* t = r->add_tools();
         t->set_name("f");
         t->set_parameters("\"not an object\"");
       }},
      {"tool_choice",
       [](v1::ChatRequest* r) {
         r->add_tools()->set_name("f");
         r->set_tool_choice_function("unknown_function");
       }},
      {"sampling.temperature",
       [](v1::ChatRequest* r) { r->mutable_sampling()->set_temperature(3); }},
      {"exceeds the context limit",
       [](v1::ChatRequest* r) { r->mutable_sampling()->set_max_tokens(1 << 30); }},
  };
  for (const Case& c : cases) {
    v1::ChatRequest req = hi_chat();
    c.set(&req);
    auto [messages, status] = chat(req);
    EXPECT_TRUE(messages.empty()) << c.names;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.names;
    EXPECT_NE(status.error_message().find(c.names), std::string::npos)
        << c.names << ": " << status.error_message();
  }
  EXPECT_EQ(engine_->stats().prompt_tokens, 0) << "a rejected chat reached the engine";
}

class GrpcAuthTest : public GrpcServerTest {
 protected:
  GrpcServerOptions server_options() override {
    GrpcServerOptions o;
    o.api_key = "sekret";
    return o;
  }
  // The status of every Loom method called with `key` (empty: no authorization metadata).
  std::vector<grpc::StatusCode> call_all(const std::string& key) {
    std::vector<grpc::StatusCode> codes;
    auto prepare = [&](grpc::ClientContext* ctx) {
      set_deadline(ctx);
      if (!key.empty()) ctx->AddMetadata("authorization", key);
    };
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::GenerateRequest req;
      req.set_text("hi");
      req.mutable_sampling()->set_max_tokens(2);
      auto reader = stub_->Generate(&ctx, req);
      v1::GenerateResponse resp;
      while (reader->Read(&resp)) {
      }
      codes.push_back(reader->Finish().error_code());
    }
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      auto reader = stub_->Chat(&ctx, hi_chat());
      v1::ChatResponse resp;
      while (reader->Read(&resp)) {
      }
      codes.push_back(reader->Finish().error_code());
    }
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::TokenizeRequest req;
      req.set_text("hi");
      v1::TokenizeResponse resp;
      codes.push_back(stub_->Tokenize(&ctx, req, &resp).error_code());
    }
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::DetokenizeRequest req;
      req.add_token_ids(104);
      v1::DetokenizeResponse resp;
      codes.push_back(stub_->Detokenize(&ctx, req, &resp).error_code());
    }
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::GetModelInfoResponse resp;
      codes.push_back(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &resp).error_code());
    }
    {
      grpc::ClientContext ctx;
      prepare(&ctx);
      v1::GetStatsResponse resp;
      codes.push_back(stub_->GetStats(&ctx, v1::GetStatsRequest(), &resp).error_code());
    }
    return codes;
  }
};

TEST_F(GrpcAuthTest, EveryMethodButHealthNeedsTheKey) {
  const std::vector<grpc::StatusCode> denied(6, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call_all(""), denied);
  EXPECT_EQ(call_all("Bearer wrong"), denied);
  EXPECT_EQ(call_all("Bearer sekre"), denied);
  EXPECT_EQ(call_all("sekret"), denied);
  EXPECT_EQ(call_all("Bearer sekret"), std::vector<grpc::StatusCode>(6, grpc::StatusCode::OK));
  // Health stays open (supervisors probe without credentials).
  EXPECT_EQ(health(""), "SERVING");
  expect_released();
}

class GrpcAdmissionTest : public GrpcServerTest {
 protected:
  GrpcServerOptions server_options() override {
    GrpcServerOptions o;
    o.max_running = 1;
    o.max_queue = 2;
    return o;
  }
};

// kCalls long streams started at once against 1 running + 2 queued: exactly 3 are admitted and
// the rest get RESOURCE_EXHAUSTED at once, round after round (the gate counts atomically and
// gives tickets back when streams end).
TEST_F(GrpcAdmissionTest, ExactlyTheLimitIsAdmitted) {
  constexpr int kCalls = 10, kAdmitted = 3;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kCalls);
    std::vector<grpc::StatusCode> codes(kCalls, grpc::StatusCode::UNKNOWN);
    std::atomic<int> exhausted{0}, streaming{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kCalls; ++i) {
      contexts[i] = std::make_unique<grpc::ClientContext>();
      set_deadline(contexts[i].get());
      threads.emplace_back([&, i] {
        v1::GenerateRequest req;
        req.set_text("queue");
        req.mutable_sampling()->set_max_tokens(10000);
        req.mutable_sampling()->set_ignore_eos(true);
        while (!go) std::this_thread::yield();
        auto reader = stub_->Generate(contexts[i].get(), req);
        v1::GenerateResponse resp;
        if (reader->Read(&resp)) {
          ++streaming;
          while (reader->Read(&resp)) {
          }
        }
        codes[i] = reader->Finish().error_code();
        if (codes[i] == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      });
    }
    go = true;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((exhausted < kCalls - kAdmitted || streaming < 1) &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // no late extra refusal
    EXPECT_EQ(exhausted.load(), kCalls - kAdmitted) << "round " << round;
    EXPECT_EQ(server_->in_flight(), kAdmitted) << "round " << round;
    for (auto& c : contexts) c->TryCancel();
    for (auto& t : threads) t.join();
    int cancelled = 0;
    for (grpc::StatusCode c : codes) cancelled += c == grpc::StatusCode::CANCELLED;
    EXPECT_EQ(cancelled, kAdmitted) << "round " << round;
    expect_released();
    const auto drained = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->in_flight() > 0 && std::chrono::steady_clock::now() < drained)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace
}  // namespace loom
