#include "engine/request_stream.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

RequestOutput token_event(int32_t token) {
  RequestOutput out;
  out.token_ids = {token};
  return out;
}

TEST(RequestStream, OnReadyAnnouncesEveryPushAndTheCloseOutsideTheLock) {
  RequestStream s(/*id=*/1, /*num_choices=*/1);
  s.push(token_event(7));  // before the callback: not announced
  std::vector<int32_t> seen;
  int calls = 0;
  // The callback drains the stream itself: it would deadlock if called under the stream's lock.
  s.set_on_ready([&] {
    ++calls;
    while (auto e = s.next(absl::ZeroDuration())) seen.push_back(e->token_ids.at(0));
  });
  EXPECT_EQ(calls, 0);
  s.push(token_event(8));
  s.push(token_event(9));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen, (std::vector<int32_t>{7, 8, 9}));
  s.close();
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(s.closed());
  s.set_on_ready(nullptr);
  s.push(token_event(10));  // after removal: no call
  EXPECT_EQ(calls, 3);
}

TEST(RequestStream, ConsumerWokenByOnReadyMissesNothing) {
  // A consumer that sleeps until signalled (as the server's pump does) receives every event of a
  // producer on another thread, in order, and sees the close.
  RequestStream s(/*id=*/2, /*num_choices=*/1);
  absl::Mutex mu;
  bool signaled = false;
  s.set_on_ready([&] {
    absl::MutexLock lock(&mu);
    signaled = true;
  });
  constexpr int kEvents = 20000;
  std::thread producer([&] {
    for (int i = 0; i < kEvents; ++i) s.push(token_event(i));
    s.close();
  });
  std::vector<int32_t> got;
  while (true) {
    {
      absl::MutexLock lock(&mu);
      signaled = false;
    }
    while (auto e = s.next(absl::ZeroDuration())) got.push_back(e->token_ids.at(0));
    if (s.closed()) break;
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&signaled));
  }
  producer.join();
  ASSERT_EQ(got.size(), static_cast<size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) ASSERT_EQ(got[i], i);
}

}  // namespace
}  // namespace loom
