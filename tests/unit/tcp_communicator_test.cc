// Ranks in several "nodes" over TCP (engine/parallel/tcp_communicator.h, node_rendezvous.h), the
// nodes here threads of one process on localhost, each with its own rendezvous, connections and
// TcpGroup, exactly as separate processes would have. Oracles: the thread ranks (ThreadGroup) on
// the same inputs, bit for bit, for every collective (uneven all_to_all counts, zero rows, ranks
// split unevenly over the nodes); the rendezvous refusing disagreeing nodes with a message naming
// both; and the failure contract across processes: a rank's error, a node that vanishes and one
// that hangs fail every other node with a clear error, never a hang.
#include "engine/parallel/tcp_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/parallel/thread_communicator.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;
using Body = std::function<absl::Status(Communicator&)>;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

RendezvousOptions node_options(int nnodes, int node, const std::vector<int>& split, int port,
                               absl::Duration timeout) {
  int world = 0;
  for (int n : split) world += n;
  return {.nnodes = nnodes,
          .node_rank = node,
          .coordinator = {.host = "127.0.0.1", .port = port},
          .local_ranks = split[node],
          .world_size = world,
          .settings = {{"model", "fixture"}, {"expert_dispatch", "all_to_all"}},
          .blob = node == 0 ? "unique-id-bytes" : "",
          .timeout = timeout};
}

// Runs `body` on every rank of nodes with split[m] local ranks each (node m a thread with its own
// rendezvous and TcpGroup). `tweak` may change a node's options (mismatch tests). Returns each
// node's run status (the rendezvous' failure if it failed there).
std::vector<absl::Status> run_nodes(
    const std::vector<int>& split, absl::Duration timeout, const Body& body,
    const std::function<void(int, RendezvousOptions&)>& tweak = nullptr,
    std::vector<std::string>* blobs = nullptr) {
  const int nnodes = static_cast<int>(split.size());
  absl::StatusOr<Socket> listener = listen_tcp(0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  const int port = local_port(*listener);
  std::vector<absl::Status> out(nnodes);
  if (blobs != nullptr) blobs->assign(nnodes, "");
  std::vector<std::thread> nodes;
  for (int m = 0; m < nnodes; ++m) {
    nodes.emplace_back([&, m] {
      RendezvousOptions o = node_options(nnodes, m, split, port, timeout);
      if (tweak) tweak(m, o);
      absl::StatusOr<Rendezvous> rv = rendezvous(o, m == 0 ? &*listener : nullptr);
      if (!rv.ok()) {
        out[m] = rv.status();
        return;
      }
      if (blobs != nullptr) (*blobs)[m] = rv->blob;
      TcpGroup group(std::move(rv).value(), timeout);
      out[m] = run_local_ranks(group, body, 1);
    });
  }
  for (std::thread& t : nodes) t.join();
  return out;
}

// A script of every collective at random shapes, each rank recording the bytes it received; the
// inputs depend only on (rank, step), so two transports must record the same.
struct Script {
  int world = 0;
  uint32_t seed = 0;
  std::vector<std::vector<std::vector<char>>>* received = nullptr;  // [rank][step]

  absl::Status operator()(Communicator& comm) const {
    const int r = comm.rank(), n = comm.size();
    if (n != world) return absl::InternalError("wrong world size");
    std::mt19937 shapes(seed);  // the same on every rank: the shapes all ranks agree on
    auto& mine = (*received)[r];
    for (int step = 0; step < 24; ++step) {
      std::mt19937 values(seed * 1000 + r * 100 + step);
      std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
      std::uniform_int_distribution<int> expo(-20, 20);
      const int kind = step % 3;
      const int64_t rows = step % 7 == 0 ? 0 : static_cast<int64_t>(shapes() % 6);
      const int64_t cols = 1 + static_cast<int64_t>(shapes() % 5);
      Tensor recv;
      absl::Status st;
      if (kind == 0) {
        const DType dt = step % 2 ? DType::kF32 : DType::kI64;
        Tensor send = Tensor::empty({rows, cols}, dt);
        recv = Tensor::empty({n * rows, cols}, dt);
        auto* b = static_cast<unsigned char*>(send.raw());
        for (size_t i = 0; i < send.nbytes(); ++i) b[i] = static_cast<unsigned char>(values());
        st = comm.all_gather(send, recv);
      } else if (kind == 1) {
        // Magnitudes 2^-20..2^20: any other summation order rounds differently.
        Tensor send = Tensor::empty({n * rows, cols});
        for (int64_t i = 0; i < send.numel(); ++i)
          send.data<float>()[i] = std::ldexp(mant(values), expo(values));
        recv = Tensor::empty({rows, cols});
        st = comm.reduce_scatter(send, recv);
      } else {
        // counts[a][b], rows a sends b: the same matrix on every rank, with zeros (a rank that
        // sends nothing, one that receives nothing).
        std::vector<std::vector<int64_t>> counts(n, std::vector<int64_t>(n));
        const int silent = static_cast<int>(shapes() % n);
        for (int a = 0; a < n; ++a)
          for (int b = 0; b < n; ++b) {
            const int64_t c = static_cast<int64_t>(shapes() % 5);
            counts[a][b] = (step % 4 == 2 && (a == silent || b == silent)) ? 0 : c;
          }
        std::vector<int64_t> sends(n), recvs(n);
        int64_t out = 0, in = 0;
        for (int q = 0; q < n; ++q) {
          sends[q] = counts[r][q];
          recvs[q] = counts[q][r];
          out += sends[q];
          in += recvs[q];
        }
        Tensor send = Tensor::empty({out + 1, cols});  // a spare row: sends need not fill it
        for (int64_t i = 0; i < send.numel(); ++i) send.data<float>()[i] = mant(values);
        recv = Tensor::zeros({in, cols});
        st = comm.all_to_all(send, sends, recv, recvs);
      }
      if (!st.ok()) return st;
      const char* p = static_cast<const char*>(recv.raw());
      mine.emplace_back(p, p + recv.nbytes());
    }
    return absl::OkStatus();
  }
};

void expect_same_as_threads(const std::vector<int>& split, uint32_t seed) {
  int world = 0;
  for (int n : split) world += n;
  std::vector<std::vector<std::vector<char>>> over_tcp(world), over_threads(world);
  const std::vector<absl::Status> st =
      run_nodes(split, absl::Seconds(30), Script{world, seed, &over_tcp});
  for (size_t m = 0; m < st.size(); ++m) ASSERT_TRUE(st[m].ok()) << "node " << m << ": " << st[m];
  const absl::Status t =
      run_thread_ranks(world, absl::Seconds(30), Script{world, seed, &over_threads}, 1);
  ASSERT_TRUE(t.ok()) << t;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(over_tcp[r].size(), over_threads[r].size()) << "rank " << r;
    for (size_t s = 0; s < over_tcp[r].size(); ++s)
      EXPECT_EQ(over_tcp[r][s], over_threads[r][s]) << "rank " << r << " step " << s;
  }
}

TEST(TcpCommunicator, TwoNodesOneRankEachMatchThreadRanks) { expect_same_as_threads({1, 1}, 1); }

TEST(TcpCommunicator, UnevenNodesMatchThreadRanks) {
  expect_same_as_threads({2, 1}, 2);
  expect_same_as_threads({1, 3, 2}, 3);
}

TEST(TcpCommunicator, OneNodeIsThreadRanks) { expect_same_as_threads({3}, 4); }

TEST(TcpCommunicator, RendezvousAssignsRanksInNodeOrderAndSendsTheBlob) {
  std::vector<std::string> blobs;
  std::vector<int> firsts(5, -1);
  const std::vector<absl::Status> st = run_nodes(
      {2, 1, 2}, absl::Seconds(30),
      [&](Communicator& comm) -> absl::Status {
        absl::StatusOr<int64_t> total = lockstep_tokens(comm, comm.rank() + 1);
        if (!total.ok()) return total.status();
        return *total == 15 ? absl::OkStatus() : absl::InternalError("wrong sum");
      },
      nullptr, &blobs);
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
  for (const std::string& b : blobs) EXPECT_EQ(b, "unique-id-bytes");
}

// Two nodes that disagree on a setting, the group size or the node count: every node fails at
// the rendezvous with one message naming both nodes and both values.
TEST(TcpRendezvous, RefusesMismatchesNamingBothNodes) {
  const Body never = [](Communicator&) { return absl::InternalError("ran"); };
  std::vector<absl::Status> st =
      run_nodes({1, 1}, absl::Seconds(20), never, [](int m, RendezvousOptions& o) {
        if (m == 1) o.settings[1].second = "all_gather";
      });
  for (const absl::Status& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("node 1 ("), std::string::npos) << s;
    EXPECT_NE(s.message().find("expert_dispatch=all_gather but node 0 ("), std::string::npos) << s;
    EXPECT_NE(s.message().find("expert_dispatch=all_to_all"), std::string::npos) << s;
  }
  st = run_nodes({2, 2}, absl::Seconds(20), never, [](int m, RendezvousOptions& o) {
    if (m == 1) o.world_size = 6;
  });
  for (const absl::Status& s : st) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("expects 6 ranks in all but node 0 ("), std::string::npos) << s;
  }
  st = run_nodes({1, 1}, absl::Seconds(20), never, [](int m, RendezvousOptions& o) {
    if (m == 1) o.settings.pop_back();
  });
  for (const absl::Status& s : st)
    EXPECT_NE(s.message().find("does not set expert_dispatch"), std::string::npos) << s;
}

TEST(TcpRendezvous, MissingNodeTimesOut) {
  absl::StatusOr<Socket> listener = listen_tcp(0);
  ASSERT_TRUE(listener.ok());
  RendezvousOptions o = node_options(2, 0, {1, 1}, local_port(*listener), absl::Seconds(1));
  const absl::StatusOr<Rendezvous> rv = rendezvous(o, &*listener);
  EXPECT_EQ(rv.status().code(), absl::StatusCode::kDeadlineExceeded) << rv.status();
  EXPECT_NE(rv.status().message().find("node(s) 1 did not join"), std::string::npos) << rv.status();
  // A node whose coordinator never comes gives up too.
  o = node_options(2, 1, {1, 1}, local_port(*listener), absl::Seconds(1));
  listener->reset();
  const absl::StatusOr<Rendezvous> lone = rendezvous(o);
  EXPECT_EQ(lone.status().code(), absl::StatusCode::kDeadlineExceeded) << lone.status();
  EXPECT_NE(lone.status().message().find("could not connect to the coordinator 127.0.0.1"),
            std::string::npos)
      << lone.status();
}

// A rank of node 1 fails: node 0's and node 2's ranks, waiting in a collective, return at once
// with that rank's error (node 0 relays it), not after the timeout.
TEST(TcpCommunicator, FailingRankFailsEveryNode) {
  const auto t0 = Clock::now();
  const std::vector<absl::Status> st =
      run_nodes({1, 2, 1}, absl::Seconds(60), [](Communicator& comm) -> absl::Status {
        Tensor send = Tensor::zeros({2, 3}), recv = Tensor::empty({8, 3});
        if (absl::Status s = comm.all_gather(send, recv); !s.ok()) return s;
        if (comm.rank() == 2) return absl::InvalidArgumentError("bad batch");
        absl::Status s = comm.all_gather(send, recv);
        return s.ok() ? absl::InternalError("collective after a failure succeeded") : s;
      });
  for (size_t m = 0; m < st.size(); ++m) {
    EXPECT_EQ(st[m].code(), absl::StatusCode::kInvalidArgument) << "node " << m << ": " << st[m];
    EXPECT_EQ(st[m].message(), "rank 2: bad batch") << "node " << m;
  }
  EXPECT_LT(seconds_since(t0), 30.0) << "waited for the timeout instead";
}

// Ranks out of lockstep across nodes: node 0 sees both posts and fails everyone naming them.
TEST(TcpCommunicator, OutOfLockstepAcrossNodes) {
  const std::vector<absl::Status> st =
      run_nodes({1, 1}, absl::Seconds(60), [](Communicator& comm) -> absl::Status {
        const int64_t rows = comm.rank() == 1 ? 3 : 2;
        Tensor send = Tensor::zeros({rows, 4}), recv = Tensor::empty({2 * rows, 4});
        return comm.all_gather(send, recv);
      });
  for (const absl::Status& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("out of lockstep: rank 0 posted all_gather #0 (2 rows"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("rank 1 posted all_gather #0 (3 rows"), std::string::npos) << s;
  }
}

// A node whose process vanishes (its connections closed without a bye, as when it is killed):
// the other nodes fail at their next collective with "lost node N", well before the timeout.
TEST(TcpCommunicator, VanishedNodeFailsTheOthersAtOnce) {
  absl::StatusOr<Socket> listener = listen_tcp(0);
  ASSERT_TRUE(listener.ok());
  const int port = local_port(*listener);
  const std::vector<int> split{1, 1, 1};
  std::vector<absl::Status> out(3);
  std::vector<double> took(3, -1);
  std::vector<std::thread> nodes;
  const auto t0 = Clock::now();
  for (int m = 0; m < 3; ++m) {
    nodes.emplace_back([&, m] {
      absl::StatusOr<Rendezvous> rv = rendezvous(node_options(3, m, split, port, absl::Seconds(60)),
                                                 m == 0 ? &*listener : nullptr);
      if (!rv.ok()) {
        out[m] = rv.status();
        return;
      }
      if (m == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return;  // its sockets close here: no group, no bye
      }
      TcpGroup group(std::move(rv).value(), absl::Seconds(60));
      out[m] = run_local_ranks(
          group,
          [](Communicator& comm) -> absl::Status {
            Tensor send = Tensor::zeros({1}), recv = Tensor::empty({3});
            return comm.all_gather(send, recv);
          },
          1);
      took[m] = seconds_since(t0);
    });
  }
  for (std::thread& t : nodes) t.join();
  for (int m : {0, 1}) {
    EXPECT_EQ(out[m].code(), absl::StatusCode::kUnavailable) << "node " << m << ": " << out[m];
    EXPECT_NE(out[m].message().find("lost node 2 ("), std::string::npos) << out[m];
    EXPECT_LT(took[m], 30.0) << "node " << m << " waited for the timeout instead";
  }
}

// A node that stays connected but never reaches the collective (hung): the others fail with
// DeadlineExceeded naming it once the timeout has passed, and do not hang.
TEST(TcpCommunicator, HungNodeTimesOut) {
  const std::vector<absl::Status> st =
      run_nodes({1, 1}, absl::Seconds(1), [&](Communicator& comm) -> absl::Status {
        if (comm.rank() == 1) {
          // Hangs until the other node has failed the group, then sees the failure.
          while (comm.status().ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return comm.status();
        }
        Tensor send = Tensor::zeros({1}), recv = Tensor::empty({2});
        return comm.all_gather(send, recv);
      });
  // The collective's wait or the heartbeat watch, whichever notices first (a loaded machine may
  // delay node 1's heartbeats past the second too): either names node 1.
  for (const absl::Status& s : st) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(s.message().find("waited 1s at all_gather #0 for node 1 (") != std::string::npos ||
                s.message().find("nothing from node 1 (") != std::string::npos)
        << s;
  }
}

// A node that finished and left on purpose is not a failure of the others' status; a collective
// that would need it fails at once, and departed() names it.
TEST(TcpCommunicator, NodeThatLeftIsNamedNotWaitedFor) {
  absl::StatusOr<Socket> listener = listen_tcp(0);
  ASSERT_TRUE(listener.ok());
  const int port = local_port(*listener);
  absl::Status after_leave, departed;
  std::thread n1([&] {
    absl::StatusOr<Rendezvous> rv = rendezvous(node_options(2, 1, {1, 1}, port, absl::Seconds(60)));
    ASSERT_TRUE(rv.ok()) << rv.status();
    TcpGroup group(std::move(rv).value(), absl::Seconds(60));
    EXPECT_TRUE(run_local_ranks(
                    group, [](Communicator& c) { return lockstep_tokens(c, 1).status(); }, 1)
                    .ok());
  });
  absl::StatusOr<Rendezvous> rv =
      rendezvous(node_options(2, 0, {1, 1}, port, absl::Seconds(60)), &*listener);
  ASSERT_TRUE(rv.ok()) << rv.status();
  {
    TcpGroup group(std::move(rv).value(), absl::Seconds(60));
    EXPECT_TRUE(run_local_ranks(
                    group, [](Communicator& c) { return lockstep_tokens(c, 1).status(); }, 1)
                    .ok());
    n1.join();  // node 1 has left
    EXPECT_TRUE(group.status().ok()) << group.status();
    departed = group.departed();
    after_leave = lockstep_tokens(group.local_rank(0), 1).status();
  }
  EXPECT_EQ(departed.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(departed.message().find("node 1 ("), std::string::npos) << departed;
  EXPECT_EQ(after_leave.code(), absl::StatusCode::kUnavailable) << after_leave;
  EXPECT_NE(after_leave.message().find("has left the group"), std::string::npos) << after_leave;
}

}  // namespace
}  // namespace loom
