#include "engine/parallel/tcp_communicator.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "engine/parallel/collective_post.h"

namespace loom {
namespace {

// How long the I/O thread waits for frames before looking at the clock (heartbeats, silence,
// stopping).
constexpr absl::Duration kIoTick = absl::Milliseconds(50);

void check_host(const Tensor& send, const Tensor& recv, const char* op) {
  LOOM_CHECK(send.device().is_cpu() && recv.device().is_cpu() && send.is_contiguous() &&
                 recv.is_contiguous() && send.ndim() >= 1 && recv.ndim() >= 1,
             "%s: TCP ranks take contiguous host tensors (send %s, recv %s)", op, send.describe(),
             recv.describe());
}

}  // namespace

class TcpCommunicator;

// A connection to another node.
struct Peer {
  NodeInfo info;
  Socket sock;
  absl::Mutex send_mu;  // one frame at a time on the socket
};

struct TcpGroup::State {
  State(Rendezvous rv, absl::Duration t)
      : node(rv.node_rank),
        nnodes(static_cast<int>(rv.nodes.size())),
        first(rv.nodes[rv.node_rank].first_rank),
        local(rv.nodes[rv.node_rank].local_ranks),
        world(rv.nodes.back().first_rank + rv.nodes.back().local_ranks),
        timeout(t),
        heartbeat(std::clamp(t / 4, absl::Milliseconds(10), absl::Seconds(1))),
        nodes(rv.nodes),
        posts(local),
        recvs(local, nullptr),
        arrived(local, false),
        remote_posts(nnodes),
        open(rv.peers.size(), false),
        left(rv.peers.size(), false),
        last_heard(rv.peers.size(), absl::Now()) {
    for (size_t i = 0; i < rv.peers.size(); ++i) {
      auto p = std::make_unique<Peer>();
      p->info = node == 0 ? nodes[i] : nodes[0];
      p->sock = std::move(rv.peers[i]);
      open[i] = p->sock.valid();
      peers.push_back(std::move(p));
    }
  }

  // The node a peer index stands for.
  int node_of(size_t peer) const { return node == 0 ? static_cast<int>(peer) : 0; }
  std::string describe_peer(size_t i) const { return describe_node(peers[i]->info); }

  // Fails the group with `why` (kept if first) and tells the other nodes: node 0 relays to every
  // node but the one it came from (`from_peer`), another node tells node 0 unless the failure
  // came from it. Never called with mu held.
  void fail(const absl::Status& why, int from_peer = -1) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      if (!failure.ok()) return;
      failure = why.ok() ? absl::InternalError("aborted with OK") : why;
      cv.SignalAll();
    }
    const std::string payload = encode_status(why);
    const absl::Time deadline = absl::Now() + std::min(timeout, absl::Seconds(5));
    for (size_t i = 0; i < peers.size(); ++i) {
      if (static_cast<int>(i) == from_peer || !peers[i]->sock.valid()) continue;
      if (node != 0 && i != 0) continue;
      absl::MutexLock send(&peers[i]->send_mu);
      send_frame(peers[i]->sock, NodeFrame::kAbort, payload, deadline).IgnoreError();
    }
  }

  absl::Status status() const {
    absl::MutexLock lock(&mu);
    return failure;
  }

  // The failure when a peer's connection broke (reading or sending), one wording for both.
  static absl::Status lost(const NodeInfo& n, const std::string& how) {
    return absl::UnavailableError(
        absl::StrCat("expert-parallel group: lost ", describe_node(n), ": ", how,
                     " (the process exited, was killed, or the network failed)"));
  }

  // The I/O thread: reads every frame the peers send, sends heartbeats, watches for silence.
  void io_loop();
  void on_frame(size_t peer, ReceivedFrame frame);

  // The local leader's part of a collective (all local ranks posted; none of them can return
  // until this does). Returns the collective's status; a failure has already failed the group.
  absl::Status lead();
  absl::Status lead_node0(const CollectivePost& mine);
  absl::Status lead_other(const CollectivePost& mine);

  // Constant after construction.
  const int node, nnodes, first, local, world;
  const absl::Duration timeout, heartbeat;
  const std::vector<NodeInfo> nodes;
  std::vector<std::unique_ptr<Peer>> peers;  // node 0: peers[m] is node m's; else peers[0]
  std::vector<std::unique_ptr<TcpCommunicator>> ranks;
  std::thread io;

  mutable absl::Mutex mu;
  absl::CondVar cv;
  // The collective in flight: each local rank's post and result buffer, written before its
  // arrival and read by the leader while every local rank waits.
  std::vector<CollectivePost> posts ABSL_GUARDED_BY(mu);
  std::vector<char*> recvs ABSL_GUARDED_BY(mu);
  std::vector<bool> arrived ABSL_GUARDED_BY(mu);
  int count ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // collectives completed
  absl::Status failure ABSL_GUARDED_BY(mu);
  std::string departed ABSL_GUARDED_BY(mu);  // the first peer that left on purpose
  // Node 0: each node's kPost not yet used (at most one: a node waits for its reply).
  std::vector<std::optional<std::string>> remote_posts ABSL_GUARDED_BY(mu);
  std::optional<std::string> reply ABSL_GUARDED_BY(mu);  // another node: node 0's kReply
  // Per peer: still reading it, it said bye, when a frame last came from it.
  std::vector<bool> open ABSL_GUARDED_BY(mu);
  std::vector<bool> left ABSL_GUARDED_BY(mu);
  std::vector<absl::Time> last_heard ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
};

void TcpGroup::State::on_frame(size_t i, ReceivedFrame f) {
  absl::Status bad;
  {
    absl::MutexLock lock(&mu);
    last_heard[i] = absl::Now();
    switch (f.type) {
      case NodeFrame::kHeartbeat:
        return;
      case NodeFrame::kBye:
        left[i] = true;
        if (departed.empty())
          departed = absl::StrCat(describe_peer(i), " left the expert-parallel group");
        cv.SignalAll();
        return;
      case NodeFrame::kPost:
        if (node == 0 && !remote_posts[i]) {
          remote_posts[i] = std::move(f.payload);
          cv.SignalAll();
          return;
        }
        break;
      case NodeFrame::kReply:
        if (node != 0 && !reply) {
          reply = std::move(f.payload);
          cv.SignalAll();
          return;
        }
        break;
      case NodeFrame::kAbort:
        break;
      default:
        break;
    }
  }
  if (f.type == NodeFrame::kAbort) {
    absl::StatusOr<absl::Status> why = decode_status(f.payload);
    fail(why.ok() ? *why
                  : absl::InternalError(absl::StrCat(describe_peer(i),
                                                     " failed the group with a "
                                                     "malformed abort: ",
                                                     why.status().message())),
         static_cast<int>(i));
    return;
  }
  fail(absl::InternalError(absl::StrCat("expert-parallel group: ", describe_peer(i), " sent an ",
                                        "unexpected ", node_frame_name(f.type), " frame")));
}

void TcpGroup::State::io_loop() {
  absl::Time next_beat = absl::Now();
  std::vector<int> fds(peers.size(), -1);
  std::vector<bool> ready_v(peers.size(), false);
  while (true) {
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      for (size_t i = 0; i < peers.size(); ++i) fds[i] = open[i] ? peers[i]->sock.fd() : -1;
    }
    std::unique_ptr<bool[]> ready(new bool[peers.size()]());
    if (!poll_readable(fds, kIoTick, std::span<bool>(ready.get(), peers.size())).ok())
      absl::SleepFor(kIoTick);
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!ready[i]) continue;
      absl::StatusOr<ReceivedFrame> f = recv_frame(peers[i]->sock, absl::Now() + timeout);
      if (f.ok()) {
        on_frame(i, std::move(f).value());
        continue;
      }
      bool was_leaving = false;
      {
        absl::MutexLock lock(&mu);
        was_leaving = left[i] || stopping;
      }
      // The failure first: a leader that then finds the peer closed reports it, not a departure.
      if (!was_leaving) fail(lost(peers[i]->info, std::string(f.status().message())));
      {
        absl::MutexLock lock(&mu);
        open[i] = false;
        cv.SignalAll();
      }
      // Closing our side too lets a peer that is leaving finish its drain (see ~TcpGroup).
      shutdown(peers[i]->sock.fd(), SHUT_RDWR);
    }
    const absl::Time now = absl::Now();
    if (now >= next_beat) {
      next_beat = now + heartbeat;
      for (size_t i = 0; i < peers.size(); ++i) {
        {
          absl::MutexLock lock(&mu);
          if (!open[i]) continue;
        }
        // A peer busy receiving a large frame from this node hears from it anyway.
        if (!peers[i]->send_mu.TryLock()) continue;
        send_frame(peers[i]->sock, NodeFrame::kHeartbeat, std::string(), now + heartbeat)
            .IgnoreError();
        peers[i]->send_mu.Unlock();
      }
    }
    std::string silent;
    {
      absl::MutexLock lock(&mu);
      for (size_t i = 0; i < peers.size() && silent.empty(); ++i)
        if (open[i] && !left[i] && now - last_heard[i] > timeout)
          silent = absl::StrCat("expert-parallel group: nothing from ", describe_peer(i), " for ",
                                absl::FormatDuration(now - last_heard[i]), " (the timeout is ",
                                absl::FormatDuration(timeout), "): it hangs or the network failed");
    }
    if (!silent.empty()) fail(absl::DeadlineExceededError(silent));
  }
}

absl::Status TcpGroup::State::lead() {
  CollectivePost mine;
  {
    absl::MutexLock lock(&mu);
    mine = posts[0];
  }
  return node == 0 ? lead_node0(mine) : lead_other(mine);
}

absl::Status TcpGroup::State::lead_node0(const CollectivePost& mine) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> frames(nnodes);
  std::vector<CollectivePost> world_posts(world);
  std::vector<char*> local_recvs;
  absl::Status st;
  {
    absl::MutexLock lock(&mu);
    while (st.ok()) {
      if (!failure.ok()) return failure;
      std::vector<int> missing;
      for (int m = 1; m < nnodes; ++m)
        if (!remote_posts[m]) missing.push_back(m);
      if (missing.empty()) break;
      for (int m : missing)
        if (left[m] || !open[m])
          st = absl::UnavailableError(absl::StrCat(
              "expert-parallel group: rank ", first, " is at ", collective_op_name(mine.op), " #",
              mine.seq, " but ", describe_node(nodes[m]), " has left the group"));
      if (st.ok() && cv.WaitWithDeadline(&mu, deadline) && absl::Now() >= deadline) {
        std::vector<std::string> who;
        for (int m = 1; m < nnodes; ++m)
          if (!remote_posts[m]) who.push_back(describe_node(nodes[m]));
        if (!who.empty())
          st = absl::DeadlineExceededError(absl::StrCat(
              "expert-parallel group: rank ", first, " waited ", absl::FormatDuration(timeout),
              " at ", collective_op_name(mine.op), " #", mine.seq, " for ",
              absl::StrJoin(who, ", "), " (failed, hung, or out of lockstep)"));
      }
    }
    if (st.ok()) {
      for (int m = 1; m < nnodes; ++m) {
        frames[m] = std::move(*remote_posts[m]);
        remote_posts[m].reset();
      }
      for (int i = 0; i < local; ++i) world_posts[first + i] = posts[i];
      local_recvs = recvs;
    }
  }
  std::vector<NodePost> decoded(nnodes);
  for (int m = 1; m < nnodes && st.ok(); ++m) {
    absl::StatusOr<NodePost> p = decode_post(frames[m], nodes[m].local_ranks, world);
    if (!p.ok()) {
      st = absl::InternalError(absl::StrCat("expert-parallel group: ", describe_node(nodes[m]),
                                            " sent a malformed post: ", p.status().message()));
      break;
    }
    decoded[m] = std::move(p).value();
    for (int i = 0; i < nodes[m].local_ranks; ++i)
      world_posts[nodes[m].first_rank + i] = decoded[m].posts[i];
  }
  if (st.ok()) {
    if (const std::string why = collective_mismatch(world_posts); !why.empty())
      st = absl::InternalError(absl::StrCat("out of lockstep: ", why));
  }
  if (!st.ok()) {
    fail(st);
    return st;
  }
  for (int i = 0; i < local; ++i) collective_result(world_posts, first + i, local_recvs[i]);
  const std::string header_seq = encode_reply_header(mine.seq);
  for (int m = 1; m < nnodes; ++m) {
    int64_t bytes = 0;
    for (int i = 0; i < nodes[m].local_ranks; ++i) {
      const CollectivePost& p = world_posts[nodes[m].first_rank + i];
      bytes += p.recv_rows * p.row_bytes;
    }
    std::string out(static_cast<size_t>(bytes), '\0');
    char* at = out.data();
    for (int i = 0; i < nodes[m].local_ranks; ++i) {
      const CollectivePost& p = world_posts[nodes[m].first_rank + i];
      collective_result(world_posts, nodes[m].first_rank + i, at);
      at += p.recv_rows * p.row_bytes;
    }
    const std::span<const char> parts[2] = {header_seq, out};
    absl::MutexLock send(&peers[m]->send_mu);
    if (absl::Status s =
            send_frame(peers[m]->sock, NodeFrame::kReply, parts, absl::Now() + timeout);
        !s.ok()) {
      st = lost(nodes[m], absl::StrCat("sending ", collective_op_name(mine.op), " #", mine.seq,
                                       ": ", s.message()));
      break;
    }
  }
  if (!st.ok()) {
    fail(st);
    return status();  // the first failure: the I/O thread may have seen the loss first
  }
  return st;
}

absl::Status TcpGroup::State::lead_other(const CollectivePost& mine) {
  std::vector<CollectivePost> mine_all;
  std::vector<char*> local_recvs;
  {
    absl::MutexLock lock(&mu);
    mine_all = posts;
    local_recvs = recvs;
  }
  const std::string payload = encode_post(mine_all, world);
  absl::Status st;
  {
    absl::MutexLock send(&peers[0]->send_mu);
    st = send_frame(peers[0]->sock, NodeFrame::kPost, payload, absl::Now() + timeout);
  }
  if (!st.ok()) {
    fail(lost(nodes[0], absl::StrCat("rank ", first, " sending ", collective_op_name(mine.op), " #",
                                     mine.seq, ": ", st.message())));
    return status();
  }
  // Node 0 gives up after one timeout and says why; twice bounds a silent one.
  const absl::Time deadline = absl::Now() + 2 * timeout;
  std::string frame;
  {
    absl::MutexLock lock(&mu);
    while (!reply && failure.ok() && st.ok()) {
      if (left[0] || !open[0])
        st = absl::UnavailableError(absl::StrCat(
            "expert-parallel group: rank ", first, " is at ", collective_op_name(mine.op), " #",
            mine.seq, " but ", describe_node(nodes[0]), " has left the group"));
      else if (cv.WaitWithDeadline(&mu, deadline) && !reply && absl::Now() >= deadline)
        st = absl::DeadlineExceededError(absl::StrCat(
            "expert-parallel group: rank ", first, " waited ", absl::FormatDuration(2 * timeout),
            " at ", collective_op_name(mine.op), " #", mine.seq, " for ", describe_node(nodes[0])));
    }
    if (!failure.ok()) return failure;
    if (st.ok()) {
      frame = std::move(*reply);
      reply.reset();
    }
  }
  if (st.ok()) {
    absl::StatusOr<NodeReply> r = decode_reply(frame);
    int64_t want = 0;
    for (const CollectivePost& p : mine_all) want += p.recv_rows * p.row_bytes;
    if (!r.ok() || r->seq != mine.seq || static_cast<int64_t>(r->data.size()) != want) {
      st = absl::InternalError(absl::StrCat(
          "expert-parallel group: ", describe_node(nodes[0]), " replied to ",
          collective_op_name(mine.op), " #", mine.seq, " with ",
          r.ok() ? absl::StrCat("#", r->seq, ", ", r->data.size(), " bytes (expected ", want, ")")
                 : std::string(r.status().message())));
    } else {
      const char* at = r->data.data();
      for (size_t i = 0; i < mine_all.size(); ++i) {
        const int64_t bytes = mine_all[i].recv_rows * mine_all[i].row_bytes;
        if (bytes > 0) std::memcpy(local_recvs[i], at, static_cast<size_t>(bytes));
        at += bytes;
      }
    }
  }
  if (!st.ok()) fail(st);
  return st;
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(TcpGroup::State& g, int local) : g_(g), local_(local) {}

  int rank() const override { return g_.first + local_; }
  int size() const override { return g_.world; }

  absl::Status all_gather(const Tensor& send, const Tensor& recv) override {
    check_host(send, recv, "all_gather");
    check_all_gather_shapes(send, recv, size());
    return run({.op = CollectiveOp::kAllGather,
                .send = static_cast<const char*>(send.raw()),
                .dtype = send.dtype(),
                .row_bytes = collective_row_bytes(send),
                .send_rows = send.dim(0),
                .recv_rows = recv.dim(0)},
               recv);
  }

  absl::Status reduce_scatter(const Tensor& send, const Tensor& recv) override {
    check_host(send, recv, "reduce_scatter");
    check_reduce_scatter_shapes(send, recv, size());
    return run({.op = CollectiveOp::kReduceScatter,
                .send = static_cast<const char*>(send.raw()),
                .dtype = DType::kF32,
                .row_bytes = collective_row_bytes(send),
                .send_rows = send.dim(0),
                .recv_rows = recv.dim(0)},
               recv);
  }

  absl::Status all_to_all(const Tensor& send, std::span<const int64_t> send_counts,
                          const Tensor& recv, std::span<const int64_t> recv_counts) override {
    check_host(send, recv, "all_to_all");
    const auto [sent, received] =
        check_all_to_all_shapes(send, send_counts, recv, recv_counts, size());
    return run({.op = CollectiveOp::kAllToAll,
                .send = static_cast<const char*>(send.raw()),
                .dtype = send.dtype(),
                .row_bytes = collective_row_bytes(send),
                .send_rows = sent,
                .recv_rows = received,
                .send_counts = send_counts,
                .recv_counts = recv_counts},
               recv);
  }

  void abort(const absl::Status& why) override { g_.fail(why); }
  absl::Status status() const override { return g_.status(); }

 private:
  // The local entry barrier; the last local rank to arrive leads the exchange while the others
  // wait for it to complete the collective (or for the group to fail).
  absl::Status run(CollectivePost post, const Tensor& recv) {
    post.seq = seq_++;
    absl::Status late;
    {
      absl::MutexLock lock(&g_.mu);
      if (!g_.failure.ok()) return g_.failure;
      g_.posts[local_] = post;
      g_.recvs[local_] = static_cast<char*>(recv.raw());
      g_.arrived[local_] = true;
      const uint64_t gen = g_.generation;
      if (++g_.count < g_.local) {
        const absl::Time deadline = absl::Now() + g_.timeout;
        while (g_.generation == gen && g_.failure.ok()) {
          if (g_.count == g_.local) {
            g_.cv.Wait(&g_.mu);  // the leader's waits are bounded
          } else if (g_.cv.WaitWithDeadline(&g_.mu, deadline) && g_.count < g_.local &&
                     g_.generation == gen && g_.failure.ok()) {
            std::vector<int> missing;
            for (int i = 0; i < g_.local; ++i)
              if (!g_.arrived[i]) missing.push_back(g_.first + i);
            late = absl::DeadlineExceededError(
                absl::StrCat("expert-parallel group: rank ", rank(), " waited ",
                             absl::FormatDuration(g_.timeout), " at ", collective_op_name(post.op),
                             " #", post.seq, " for rank(s) ", absl::StrJoin(missing, ", "),
                             " (failed, hung, or out of lockstep)"));
            break;
          }
        }
        if (late.ok()) return g_.generation != gen ? absl::OkStatus() : g_.failure;
      }
    }
    if (!late.ok()) {
      g_.fail(late);
      return late;
    }
    const absl::Status st = g_.lead();
    if (st.ok()) {
      absl::MutexLock lock(&g_.mu);
      g_.count = 0;
      std::fill(g_.arrived.begin(), g_.arrived.end(), false);
      ++g_.generation;
      g_.cv.SignalAll();
    }
    return st;
  }

  TcpGroup::State& g_;
  const int local_;
  uint64_t seq_ = 0;  // collectives this rank has issued
};

TcpGroup::TcpGroup(Rendezvous rendezvous, absl::Duration timeout)
    : state_(std::make_unique<State>(std::move(rendezvous), timeout)) {
  for (int i = 0; i < state_->local; ++i)
    state_->ranks.push_back(std::make_unique<TcpCommunicator>(*state_, i));
  if (!state_->peers.empty()) state_->io = std::thread([s = state_.get()] { s->io_loop(); });
}

TcpGroup::~TcpGroup() {
  State& s = *state_;
  if (s.status().ok()) {
    const absl::Time deadline = absl::Now() + std::min(s.timeout, absl::Seconds(5));
    for (auto& p : s.peers) {
      if (!p->sock.valid()) continue;
      absl::MutexLock send(&p->send_mu);
      send_frame(p->sock, NodeFrame::kBye, std::string(), deadline).IgnoreError();
    }
  }
  {
    absl::MutexLock lock(&s.mu);
    s.stopping = true;
  }
  if (s.io.joinable()) s.io.join();
  // Read what the peers still send until they close, so that closing never resets a connection
  // with a frame of ours (a bye, an abort) still unread on the other side.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (auto& p : s.peers) {
    if (!p->sock.valid()) continue;
    shutdown(p->sock.fd(), SHUT_WR);
    while (recv_frame(p->sock, deadline).ok()) {
    }
  }
}

int TcpGroup::size() const { return state_->world; }
int TcpGroup::local_size() const { return state_->local; }
int TcpGroup::first_rank() const { return state_->first; }
int TcpGroup::node_rank() const { return state_->node; }
int TcpGroup::nnodes() const { return state_->nnodes; }

Communicator& TcpGroup::local_rank(int i) {
  LOOM_CHECK(i >= 0 && i < state_->local, "local rank %d of %d", i, state_->local);
  return *state_->ranks[i];
}

void TcpGroup::abort(const absl::Status& why) { state_->fail(why); }
absl::Status TcpGroup::status() const { return state_->status(); }

absl::Status TcpGroup::departed() const {
  absl::MutexLock lock(&state_->mu);
  if (state_->departed.empty()) return absl::OkStatus();
  return absl::UnavailableError(state_->departed);
}

}  // namespace loom
