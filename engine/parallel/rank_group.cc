#include "engine/parallel/rank_group.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace loom {

absl::Status run_local_ranks(RankGroup& group,
                             const std::function<absl::Status(Communicator&)>& body,
                             int threads_per_rank) {
  const int n = group.local_size();
  // The ranks share the machine's cores (measured on 2 cores: 3 ranks of 2 OpenMP threads each
  // run 10x slower than 3 of 1).
  if (threads_per_rank <= 0) threads_per_rank = std::max(1, omp_get_max_threads() / n);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        omp_set_num_threads(threads_per_rank);  // this thread's own setting
        const int r = group.first_rank() + i;
        absl::Status st;
        try {
          st = body(group.local_rank(i));
        } catch (const std::exception& e) {
          st = absl::InternalError(absl::StrCat("threw: ", e.what()));
        } catch (...) {
          st = absl::InternalError("threw a non-standard exception");
        }
        // A rank's own failure becomes the group's (if first), so its peers stop waiting for it.
        if (!st.ok())
          group.abort(absl::Status(st.code(), absl::StrCat("rank ", r, ": ", st.message())));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  return group.status();
}

}  // namespace loom
