#include "bench/serve/load_level.h"

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>

namespace loom::bench {

LevelRun run_level(const client::ServerUrl& url, const client::HttpClientOptions& options,
                   int concurrency, const std::vector<std::string>& bodies) {
  LevelRun run;
  run.concurrency = concurrency;
  run.records.resize(bodies.size());
  // Workers claim request indices from one counter; each writes only its claimed records, so
  // the records need no lock. The threads exist before the clock starts.
  std::atomic<size_t> next{0};
  std::latch go(1);
  auto worker = [&] {
    client::HttpClient client(url, options);
    go.wait();
    for (size_t i = next.fetch_add(1); i < bodies.size(); i = next.fetch_add(1)) {
      run.records[i] = run_stream_request(client, bodies[i]);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(concurrency);
  for (int t = 0; t < concurrency; ++t) threads.emplace_back(worker);
  const auto start = std::chrono::steady_clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace loom::bench
