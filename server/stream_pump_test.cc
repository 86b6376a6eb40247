// StreamPump: every event reaches its sink in order and the closing call comes exactly once, last,
// whether events were pushed before add(), during a pass or right before close(), over several
// threads and many streams; a pump with nothing to do calls nobody; stop() destroys the sinks of
// open streams before it returns and add() after stop() never calls its sink.
#include "server/stream_pump.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

RequestOutput token(int32_t id) {
  RequestOutput out;
  out.token_ids = {id};
  return out;
}

// What one sink saw. Thread-safe.
struct Seen {
  absl::Mutex mu;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  int closes ABSL_GUARDED_BY(mu) = 0;
  bool after_close ABSL_GUARDED_BY(mu) = false;  // a call came after the closing one
  int calls ABSL_GUARDED_BY(mu) = 0;

  StreamPump::Sink sink() {
    return [this](const std::vector<RequestOutput>& events, bool closed) {
      absl::MutexLock lock(&mu);
      ++calls;
      if (closes > 0) after_close = true;
      for (const RequestOutput& e : events)
        tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
      if (closed) ++closes;
    };
  }
  // Waits (bounded) until the closing call came.
  bool wait_closed() {
    absl::MutexLock lock(&mu);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return closes > 0; };
    return mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
  }
};

TEST(StreamPump, DeliversEverythingInOrderThenClosesOnce) {
  StreamPump pump(1);
  auto stream = std::make_shared<RequestStream>(1, 1);
  stream->push(token(0));  // before add(): no ring announces it
  Seen seen;
  pump.add(stream, seen.sink());
  for (int32_t i = 1; i < 100; ++i) stream->push(token(i));
  stream->close();
  ASSERT_TRUE(seen.wait_closed());
  absl::MutexLock lock(&seen.mu);
  ASSERT_EQ(seen.tokens.size(), 100u);
  for (int32_t i = 0; i < 100; ++i) EXPECT_EQ(seen.tokens[i], i);
  EXPECT_EQ(seen.closes, 1);
  EXPECT_FALSE(seen.after_close);
}

TEST(StreamPump, ManyStreamsOverSeveralThreads) {
  constexpr int kStreams = 64;
  constexpr int32_t kTokens = 200;
  StreamPump pump(3);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::unique_ptr<Seen>> seen;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_shared<RequestStream>(i + 1, 1));
    seen.push_back(std::make_unique<Seen>());
    pump.add(streams.back(), seen.back()->sink());
  }
  // Two producers, as the engine pushes while sinks run.
  auto produce = [&](int first) {
    for (int32_t t = 0; t < kTokens; ++t) {
      for (int i = first; i < kStreams; i += 2) streams[i]->push(token(t));
    }
    for (int i = first; i < kStreams; i += 2) streams[i]->close();
  };
  std::thread a(produce, 0), b(produce, 1);
  a.join();
  b.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(seen[i]->wait_closed()) << i;
    absl::MutexLock lock(&seen[i]->mu);
    ASSERT_EQ(seen[i]->tokens.size(), static_cast<size_t>(kTokens)) << i;
    for (int32_t t = 0; t < kTokens; ++t) ASSERT_EQ(seen[i]->tokens[t], t) << i;
    EXPECT_EQ(seen[i]->closes, 1) << i;
    EXPECT_FALSE(seen[i]->after_close) << i;
  }
  // The closing call comes before the pump forgets the stream: give it that moment.
  for (int i = 0; i < 1000 && pump.active() > 0; ++i) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(pump.active(), 0);
}

TEST(StreamPump, NothingToDoCallsNobody) {
  StreamPump pump(2);
  auto stream = std::make_shared<RequestStream>(1, 1);
  Seen seen;
  pump.add(stream, seen.sink());
  absl::SleepFor(absl::Milliseconds(100));
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.calls, 0);  // no event, no call: the pump waits for a ring, it does not poll
  }
  EXPECT_EQ(pump.active(), 1);
  stream->push(token(7));
  {
    absl::MutexLock lock(&seen.mu);
    auto got = [&seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(seen.mu) { return !seen.tokens.empty(); };
    ASSERT_TRUE(seen.mu.AwaitWithTimeout(absl::Condition(&got), absl::Seconds(10)));
    EXPECT_EQ(seen.closes, 0);
  }
  stream->close();
  ASSERT_TRUE(seen.wait_closed());
}

TEST(StreamPump, StopDestroysOpenSinksAndLaterAddsAreDropped) {
  StreamPump pump(2);
  std::vector<std::shared_ptr<RequestStream>> streams;
  auto owner = std::make_shared<int>(0);  // what the sinks capture
  std::atomic<int> calls{0};
  for (int i = 0; i < 4; ++i) {
    streams.push_back(std::make_shared<RequestStream>(i + 1, 1));
    pump.add(streams.back(), [owner, &calls](const std::vector<RequestOutput>&, bool) { ++calls; });
  }
  streams[0]->push(token(1));
  std::weak_ptr<int> watch = owner;
  owner.reset();
  pump.stop();
  EXPECT_TRUE(watch.expired());  // every sink is gone once stop() returns
  const int before = calls.load();
  EXPECT_LE(before, 1);  // at most the one event pushed before stop()

  auto later = std::make_shared<RequestStream>(9, 1);
  auto captured = std::make_shared<int>(0);
  std::weak_ptr<int> watch_later = captured;
  pump.add(later, [captured, &calls](const std::vector<RequestOutput>&, bool) { ++calls; });
  captured.reset();
  EXPECT_TRUE(watch_later.expired());
  later->push(token(2));  // rings a bell nobody waits on
  later->close();
  for (auto& s : streams) s->close();
  pump.stop();  // idempotent
  EXPECT_EQ(calls.load(), before);
  EXPECT_EQ(pump.active(), 0);
}

}  // namespace
}  // namespace loom
