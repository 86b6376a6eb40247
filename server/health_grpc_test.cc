// grpc.health.v1 on a GrpcServer that follows a Readiness (loom-server's wiring): Check answers
// NOT_SERVING for the server as a whole and for loom.v1.Loom until every start-up check passed,
// SERVING then, NOT_SERVING from the drain on, without the API key; Watch streams the same changes
// in order; the drain is final whichever side begins it; after shutdown() the readiness no longer
// reaches the server. The health messages are one field each, written and read by hand (no C++
// stubs for grpc.health.v1 in this build).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/grpc_server.h"
#include "server/readiness.h"

namespace loom {
namespace {

using Check = Readiness::Check;
constexpr Check kAll[] = {Check::kModel, Check::kWorkspace, Check::kCudaGraphs, Check::kFrontends};

std::string health_request(const std::string& service) {
  if (service.empty()) return "";
  return std::string("\x0a") + static_cast<char>(service.size()) + service;
}

std::string status_name(const std::string& response) {
  if (response == std::string("\x08\x01", 2)) return "SERVING";
  if (response == std::string("\x08\x02", 2)) return "NOT_SERVING";
  if (response == std::string("\x08\x03", 2)) return "SERVICE_UNKNOWN";
  if (response.empty()) return "UNKNOWN";  // proto3: the default value is not written
  return "unexpected response";
}

std::string bytes_of(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (buffer.Dump(&slices).ok())
    for (const grpc::Slice& s : slices)
      out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

auto deadline(int seconds = 30) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

class HealthGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::load(std::string(LOOM_FIXTURES_DIR) + "/kimi_linear_s1");
    ASSERT_TRUE(model.ok()) << model.status();
    EngineOptions eo;
    eo.cache_budget_bytes = int64_t{64} << 20;
    eo.max_num_seqs = 4;
    auto engine = Engine::create(std::move(*model), Tokenizer::byte_level(), eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    GrpcServerOptions options;
    options.api_key = "secret";  // health needs none
    options.readiness = &readiness_;
    auto server = GrpcServer::start(*engine_, Tokenizer::byte_level(), "s1", nullptr, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->shutdown();
    if (engine_) engine_->shutdown();
  }

  // Check of `service`: the status name, or the failed call's code.
  std::string check(const std::string& service) {
    grpc::GenericStub generic(channel_);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Slice slice(health_request(service));
    grpc::ByteBuffer request(&slice, 1), response;
    auto call = generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok) || !ok) return "no answer";
    if (!status.ok()) return "code " + std::to_string(status.error_code());
    return status_name(bytes_of(response));
  }

  void pass_all() {
    for (Check c : kAll) readiness_.pass(c, "ok");
  }

  Readiness readiness_;  // outlives the server, as main.cc's does
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A Watch stream of `service`: each status the server sends, in order.
class Watch {
 public:
  Watch(const std::shared_ptr<grpc::Channel>& channel, const std::string& service)
      : generic_(channel) {
    ctx_.set_deadline(deadline());
    call_ = generic_.PrepareCall(&ctx_, "/grpc.health.v1.Health/Watch", &cq_);
    call_->StartCall(reinterpret_cast<void*>(1));
    EXPECT_TRUE(wait());
    grpc::Slice slice(health_request(service));
    grpc::ByteBuffer request(&slice, 1);
    call_->Write(request, reinterpret_cast<void*>(2));
    EXPECT_TRUE(wait());
    call_->WritesDone(reinterpret_cast<void*>(3));
    EXPECT_TRUE(wait());
  }
  ~Watch() {
    ctx_.TryCancel();
    grpc::Status status;
    call_->Finish(&status, reinterpret_cast<void*>(5));
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  // The next status sent, or "none" when none came within the deadline.
  std::string next() {
    grpc::ByteBuffer buffer;
    call_->Read(&buffer, reinterpret_cast<void*>(4));
    if (!wait()) return "none";
    return status_name(bytes_of(buffer));
  }

 private:
  bool wait() {
    void* tag = nullptr;
    bool ok = false;
    return cq_.AsyncNext(&tag, &ok, deadline(10)) == grpc::CompletionQueue::GOT_EVENT && ok;
  }
  grpc::GenericStub generic_;
  grpc::ClientContext ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
};

TEST_F(HealthGrpcTest, FollowsTheStartupChecksThenTheDrain) {
  for (Check c : kAll) {
    EXPECT_EQ(check(""), "NOT_SERVING") << "before " << Readiness::name(c);
    EXPECT_EQ(check("loom.v1.Loom"), "NOT_SERVING") << "before " << Readiness::name(c);
    readiness_.pass(c, "ok");
  }
  EXPECT_EQ(check(""), "SERVING");
  EXPECT_EQ(check("loom.v1.Loom"), "SERVING");
  EXPECT_EQ(check("no.such.Service"), "code " + std::to_string(grpc::StatusCode::NOT_FOUND));
  readiness_.begin_drain();
  EXPECT_EQ(check(""), "NOT_SERVING");
  EXPECT_EQ(check("loom.v1.Loom"), "NOT_SERVING");
}

TEST_F(HealthGrpcTest, WatchStreamsEachChange) {
  Watch all(channel_, ""), loom(channel_, "loom.v1.Loom");
  EXPECT_EQ(all.next(), "NOT_SERVING");
  EXPECT_EQ(loom.next(), "NOT_SERVING");
  pass_all();
  EXPECT_EQ(all.next(), "SERVING");
  EXPECT_EQ(loom.next(), "SERVING");
  readiness_.begin_drain();
  EXPECT_EQ(all.next(), "NOT_SERVING");
  EXPECT_EQ(loom.next(), "NOT_SERVING");
}

// The frontend's own drain (main.cc begins both) keeps health down even if the readiness were to
// turn ready afterwards.
TEST_F(HealthGrpcTest, FrontendDrainIsFinal) {
  server_->begin_drain();
  pass_all();
  ASSERT_TRUE(readiness_.ready());
  EXPECT_EQ(check(""), "NOT_SERVING");
  EXPECT_EQ(check("loom.v1.Loom"), "NOT_SERVING");
}

TEST_F(HealthGrpcTest, ShutdownUnsubscribes) {
  pass_all();
  EXPECT_EQ(check(""), "SERVING");
  server_->shutdown();
  server_.reset();
  readiness_.begin_drain();  // would reach a destroyed server if still subscribed
  EXPECT_FALSE(readiness_.ready());
}

}  // namespace
}  // namespace loom
