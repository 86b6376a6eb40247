// AdmissionGate: simultaneous acquisitions never overshoot the limit, tickets give their units back
// when destroyed or moved from, draining refuses everything with Unavailable; api_key_matches.
#include "server/admission.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(AdmissionGate, SimultaneousRequestsGetExactlyTheLimit) {
  AdmissionGate gate(/*max_running=*/1, /*max_queue=*/2);
  ASSERT_EQ(gate.limit(), 3);
  for (int round = 0; round < 50; ++round) {
    constexpr int kThreads = 16;
    std::vector<AdmissionGate::Ticket> tickets(kThreads);
    std::atomic<int> admitted{0}, exhausted{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        while (!go) std::this_thread::yield();
        absl::Status st = gate.try_acquire(1, &tickets[i]);
        if (st.ok()) ++admitted;
        if (absl::IsResourceExhausted(st)) ++exhausted;
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(admitted.load(), 3);
    EXPECT_EQ(exhausted.load(), kThreads - 3);
    EXPECT_EQ(gate.in_use(), 3);
    tickets.clear();  // every ticket gives its unit back
    EXPECT_EQ(gate.in_use(), 0);
  }
}

TEST(AdmissionGate, WeightsMovesAndDrain) {
  AdmissionGate gate(2, 2);
  AdmissionGate::Ticket a, b;
  EXPECT_TRUE(gate.try_acquire(3, &a).ok());
  absl::Status full = gate.try_acquire(2, &b);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("--max_queue"), std::string_view::npos) << full;
  EXPECT_FALSE(b);
  EXPECT_TRUE(gate.try_acquire(1, &b).ok());
  EXPECT_EQ(gate.in_use(), 4);
  AdmissionGate::Ticket moved = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_EQ(gate.in_use(), 4);
  moved.reset();
  EXPECT_EQ(gate.in_use(), 1);
  EXPECT_FALSE(gate.wait_idle(0.01));
  gate.begin_drain();
  AdmissionGate::Ticket c;
  EXPECT_TRUE(absl::IsUnavailable(gate.try_acquire(1, &c)));
  EXPECT_FALSE(c);
  std::thread release([&] { b.reset(); });
  EXPECT_TRUE(gate.wait_idle(10));
  release.join();
  EXPECT_EQ(gate.in_use(), 0);
}

TEST(ApiKey, MatchesOnlyTheExactBearerToken) {
  EXPECT_TRUE(api_key_matches("", ""));  // no key configured: anything goes
  EXPECT_TRUE(api_key_matches("whatever", ""));
  EXPECT_TRUE(api_key_matches("Bearer sekret", "sekret"));
  EXPECT_FALSE(api_key_matches("", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearer sekreT", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearer sekre", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearer sekrets", "sekret"));
  EXPECT_FALSE(api_key_matches("bearer sekret", "sekret"));
  EXPECT_FALSE(api_key_matches("Basic  sekret", "sekret"));
  EXPECT_FALSE(api_key_matches("sekret", "sekret"));
}

}  // namespace
}  // namespace loom
