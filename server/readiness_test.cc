// Readiness: not ready until every start-up check passed, not ready for good once the drain began;
// listeners hear every change once and in order; GET /ready (the route, on an HttpContext with no
// engine: the probe must not need one) answers 503 then 200 then 503 without the API key, while
// /health stays 200 through the start-up checks.
#include "server/readiness.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/http_context.h"
#include "server/http_routes.h"

namespace loom {
namespace {

using Check = Readiness::Check;
using json = nlohmann::json;

constexpr Check kAll[] = {Check::kModel, Check::kWorkspace, Check::kCudaGraphs, Check::kFrontends};

TEST(Readiness, NotReadyUntilEveryCheckPassed) {
  static_assert(std::size(kAll) == Readiness::kNumChecks);
  Readiness r;
  for (size_t i = 0; i < std::size(kAll); ++i) {
    EXPECT_FALSE(r.ready()) << "after " << i << " checks";
    const json j = json::parse(r.to_json());
    EXPECT_EQ(j["status"], "starting");
    // The reason names exactly the checks still pending.
    for (size_t k = 0; k < std::size(kAll); ++k) {
      const std::string name(Readiness::name(kAll[k]));
      EXPECT_EQ(j["checks"][name]["passed"], k < i) << name;
      EXPECT_EQ(j["reason"].get<std::string>().find(name) != std::string::npos, k >= i) << name;
    }
    r.pass(kAll[i], "detail " + std::to_string(i));
  }
  EXPECT_TRUE(r.ready());
  const json j = json::parse(r.to_json());
  EXPECT_EQ(j["status"], "ready");
  EXPECT_FALSE(j.contains("reason"));
  EXPECT_EQ(j["checks"]["cuda_graphs"]["detail"], "detail 2");
}

TEST(Readiness, DrainIsFinal) {
  Readiness r;
  for (Check c : kAll) r.pass(c, "ok");
  ASSERT_TRUE(r.ready());
  r.begin_drain();
  EXPECT_FALSE(r.ready());
  EXPECT_TRUE(r.draining());
  r.pass(Check::kFrontends, "again");
  r.begin_drain();
  EXPECT_FALSE(r.ready());
  const json j = json::parse(r.to_json());
  EXPECT_EQ(j["status"], "draining");
  EXPECT_TRUE(j["reason"].get<std::string>().find("draining") != std::string::npos);
}

TEST(Readiness, ListenersHearEachChangeOnce) {
  Readiness r;
  std::vector<bool> heard;
  const int id = r.subscribe([&](bool ready) { heard.push_back(ready); });
  EXPECT_EQ(heard, std::vector<bool>({false}));  // the state at once
  for (Check c : kAll) r.pass(c, "ok");
  r.pass(Check::kModel, "again");  // no change: nothing heard
  EXPECT_EQ(heard, std::vector<bool>({false, true}));
  std::vector<bool> late;
  const int id2 = r.subscribe([&](bool ready) { late.push_back(ready); });
  EXPECT_EQ(late, std::vector<bool>({true}));
  r.unsubscribe(id2);
  r.begin_drain();
  r.begin_drain();
  EXPECT_EQ(heard, std::vector<bool>({false, true, false}));
  EXPECT_EQ(late, std::vector<bool>({true}));
  r.unsubscribe(id);
}

// Checks passed and the drain begun from many threads: the last thing a listener hears is the
// final state, and it never hears the same state twice in a row.
TEST(Readiness, ListenersFollowConcurrentChanges) {
  for (int round = 0; round < 50; ++round) {
    Readiness r;
    absl::Mutex mu;
    std::vector<bool> heard;
    r.subscribe([&](bool ready) {
      absl::MutexLock lock(&mu);
      heard.push_back(ready);
    });
    std::vector<std::thread> threads;
    for (Check c : kAll) threads.emplace_back([&r, c] { r.pass(c, "ok"); });
    if (round % 2) threads.emplace_back([&r] { r.begin_drain(); });
    for (auto& t : threads) t.join();
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(heard.empty());
    EXPECT_EQ(heard.back(), r.ready()) << "round " << round;
    for (size_t i = 1; i < heard.size(); ++i) EXPECT_NE(heard[i], heard[i - 1]);
  }
}

HttpReply get(HttpContext& ctx, std::string_view path) {
  HttpRequestView request;
  request.method = "GET";
  request.target = path;
  RouteResult result = handle_request(ctx, request);
  EXPECT_EQ(result.generation, nullptr);
  return result.reply;
}

TEST(ReadyRoute, FollowsTheReadinessWithoutTheKey) {
  Readiness r;
  HttpContext ctx;
  ctx.options.readiness = &r;
  ctx.options.api_key = "secret";  // probes carry no key
  HttpReply reply = get(ctx, "/ready");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(json::parse(reply.body)["status"], "starting");
  EXPECT_EQ(get(ctx, "/health").status, 200);  // alive while starting
  EXPECT_EQ(get(ctx, "/v1/models").status, 401);
  for (Check c : kAll) r.pass(c, "ok");
  reply = get(ctx, "/ready");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(json::parse(reply.body)["status"], "ready");
  EXPECT_EQ(reply.content_type, "application/json");
  // loom-server's drain: the readiness first, then the frontend.
  r.begin_drain();
  ctx.draining = true;
  reply = get(ctx, "/ready");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(json::parse(reply.body)["status"], "draining");

  HttpRequestView post;
  post.method = "POST";
  post.target = "/ready";
  post.content_type = "application/json";
  EXPECT_EQ(handle_request(ctx, post).reply.status, 405);
}

TEST(ReadyRoute, WithoutReadinessReadyUntilTheDrain) {
  HttpContext ctx;
  EXPECT_EQ(get(ctx, "/ready").status, 200);
  ctx.draining = true;
  const HttpReply reply = get(ctx, "/ready");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(json::parse(reply.body)["status"], "draining");
}

}  // namespace
}  // namespace loom
