#include "engine/parallel/node_rendezvous.h"

#include <unistd.h>

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom {
namespace {

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string who(const NodeHello& h) {
  return absl::StrCat("node ", h.node_rank, " (", h.host, ", pid ", h.pid, ")");
}

// Why `h` cannot join node 0's group, or "".
std::string refuse(const NodeHello& mine, const NodeHello& h) {
  if (h.protocol != mine.protocol)
    return absl::StrCat(who(h), " speaks node protocol ", h.protocol, " but ", who(mine),
                        " speaks ", mine.protocol, " (different Loom versions)");
  if (h.nnodes != mine.nnodes)
    return absl::StrCat(who(h), " has --nnodes ", h.nnodes, " but ", who(mine), " has ",
                        mine.nnodes);
  if (h.node_rank < 1 || h.node_rank >= mine.nnodes)
    return absl::StrCat(who(h), ": --node_rank ", h.node_rank, " outside [1, ", mine.nnodes - 1,
                        "] (node 0 is the coordinator, ", who(mine), ")");
  if (h.world_size != mine.world_size)
    return absl::StrCat(who(h), " expects ", h.world_size, " ranks in all but ", who(mine),
                        " expects ", mine.world_size);
  if (h.local_ranks < 1)
    return absl::StrCat(who(h), " runs ", h.local_ranks, " ranks (needs at least one)");
  return settings_mismatch(mine, h);
}

absl::Status send_status_to(const Socket& s, NodeFrame type, const absl::Status& st,
                            absl::Time deadline) {
  return send_frame(s, type, encode_status(st), deadline);
}

absl::StatusOr<Rendezvous> coordinate(const RendezvousOptions& o, const NodeHello& mine,
                                      Socket* given) {
  Socket own;
  if (given == nullptr) {
    absl::StatusOr<Socket> l = listen_tcp(o.coordinator.port);
    if (!l.ok())
      return absl::Status(l.status().code(),
                          absl::StrCat("node 0 (the coordinator) cannot listen on port ",
                                       o.coordinator.port, ": ", l.status().message()));
    own = std::move(l).value();
    given = &own;
  }
  const absl::Time deadline = absl::Now() + o.timeout;
  std::vector<std::optional<NodeHello>> hellos(o.nnodes);
  std::vector<Socket> peers(o.nnodes);
  std::vector<std::string> addresses(o.nnodes);
  hellos[0] = mine;
  // Every node that connected learns why the group failed before node 0 gives up.
  auto fail = [&](const absl::Status& st, const Socket* extra) -> absl::Status {
    const absl::Time soon = std::min(deadline, absl::Now() + absl::Seconds(5));
    for (const Socket& p : peers)
      if (p.valid()) send_status_to(p, NodeFrame::kReject, st, soon).IgnoreError();
    if (extra != nullptr) send_status_to(*extra, NodeFrame::kReject, st, soon).IgnoreError();
    return st;
  };
  for (int joined = 1; joined < o.nnodes;) {
    absl::StatusOr<Socket> c = accept_tcp(*given, deadline);
    if (!c.ok()) {
      std::vector<int> missing;
      for (int m = 1; m < o.nnodes; ++m)
        if (!hellos[m]) missing.push_back(m);
      return fail(absl::DeadlineExceededError(absl::StrCat(
                      "expert-parallel rendezvous: node(s) ", absl::StrJoin(missing, ", "),
                      " did not join ", who(mine), " within ", absl::FormatDuration(o.timeout),
                      " (", c.status().message(), ")")),
                  nullptr);
    }
    // A connection that says nothing sensible (a port scanner, a stale node) is dropped, and
    // node 0 keeps waiting for the real nodes.
    absl::StatusOr<ReceivedFrame> f =
        recv_frame(*c, std::min(deadline, absl::Now() + absl::Seconds(10)));
    if (!f.ok() || f->type != NodeFrame::kHello) continue;
    absl::StatusOr<NodeHello> h = decode_hello(f->payload);
    if (!h.ok()) continue;
    const std::string address = peer_address(*c);
    h->host = absl::StrCat(h->host, " at ", address.substr(0, address.rfind(':')));
    if (std::string why = refuse(mine, *h); !why.empty())
      return fail(
          absl::FailedPreconditionError(absl::StrCat("expert-parallel rendezvous refused: ", why)),
          &*c);
    if (hellos[h->node_rank])
      return fail(absl::FailedPreconditionError(absl::StrCat(
                      "expert-parallel rendezvous refused: --node_rank ", h->node_rank,
                      " given twice, by ", who(*hellos[h->node_rank]), " and ", who(*h))),
                  &*c);
    peers[h->node_rank] = std::move(c).value();
    hellos[h->node_rank] = std::move(h).value();
    ++joined;
  }
  Rendezvous out;
  out.node_rank = 0;
  out.blob = o.blob;
  int64_t next = 0;
  for (int m = 0; m < o.nnodes; ++m) {
    const NodeHello& h = *hellos[m];
    out.nodes.push_back({.node_rank = m,
                         .first_rank = static_cast<int32_t>(next),
                         .local_ranks = h.local_ranks,
                         .pid = h.pid,
                         .host = h.host});
    next += h.local_ranks;
  }
  if (next != o.world_size) {
    std::vector<std::string> parts;
    for (const NodeInfo& n : out.nodes) parts.push_back(absl::StrCat(n.local_ranks));
    return fail(
        absl::FailedPreconditionError(absl::StrCat(
            "expert-parallel rendezvous refused: the nodes run ", absl::StrJoin(parts, " + "),
            " = ", next, " ranks, but the group has ", o.world_size)),
        nullptr);
  }
  const std::string welcome = encode_welcome({.nodes = out.nodes, .blob = o.blob});
  for (int m = 1; m < o.nnodes; ++m)
    if (absl::Status st = send_frame(peers[m], NodeFrame::kWelcome, welcome, deadline); !st.ok())
      return fail(
          absl::UnavailableError(absl::StrCat("expert-parallel rendezvous: welcoming ",
                                              describe_node(out.nodes[m]), ": ", st.message())),
          nullptr);
  out.peers = std::move(peers);
  return out;
}

absl::StatusOr<Rendezvous> join(const RendezvousOptions& o, const NodeHello& mine) {
  const absl::Time deadline = absl::Now() + o.timeout;
  absl::StatusOr<Socket> s = connect_tcp(o.coordinator, deadline);
  if (!s.ok())
    return absl::Status(s.status().code(), absl::StrCat("expert-parallel rendezvous: ", who(mine),
                                                        ": ", s.status().message()));
  if (absl::Status st = send_frame(*s, NodeFrame::kHello, encode_hello(mine), deadline); !st.ok())
    return absl::UnavailableError(
        absl::StrCat("expert-parallel rendezvous: ", who(mine), ": ", st.message()));
  // Node 0 answers once every node has joined, which it waits for up to its own timeout (it may
  // have started later than this node): twice ours bounds the wait.
  absl::StatusOr<ReceivedFrame> f = recv_frame(*s, absl::Now() + 2 * o.timeout);
  if (!f.ok())
    return absl::Status(
        f.status().code(),
        absl::StrCat("expert-parallel rendezvous: ", who(mine), ": no answer from the coordinator ",
                     o.coordinator.host, ":", o.coordinator.port, ": ", f.status().message()));
  if (f->type == NodeFrame::kReject) {
    absl::StatusOr<absl::Status> why = decode_status(f->payload);
    if (!why.ok()) return why.status();
    return *why;
  }
  if (f->type != NodeFrame::kWelcome)
    return absl::InternalError(absl::StrCat("expert-parallel rendezvous: the coordinator sent a ",
                                            node_frame_name(f->type), " frame, not a welcome"));
  absl::StatusOr<NodeWelcome> w = decode_welcome(f->payload);
  if (!w.ok()) return w.status();
  if (static_cast<int>(w->nodes.size()) != o.nnodes ||
      w->nodes[o.node_rank].local_ranks != o.local_ranks)
    return absl::InternalError(
        "expert-parallel rendezvous: the coordinator's node table does not match this node");
  Rendezvous out;
  out.node_rank = o.node_rank;
  out.nodes = std::move(w->nodes);
  out.blob = std::move(w->blob);
  out.peers.push_back(std::move(s).value());
  return out;
}

}  // namespace

std::string settings_mismatch(const NodeHello& a, const NodeHello& b) {
  std::map<std::string, std::string> ma(a.settings.begin(), a.settings.end());
  std::map<std::string, std::string> mb(b.settings.begin(), b.settings.end());
  for (const auto& [k, v] : ma) {
    auto it = mb.find(k);
    if (it == mb.end())
      return absl::StrCat(who(a), " has ", k, "=", v, " but ", who(b), " does not set ", k);
    if (it->second != v)
      return absl::StrCat(who(b), " has ", k, "=", it->second, " but ", who(a), " has ", k, "=", v);
  }
  for (const auto& [k, v] : mb)
    if (!ma.contains(k))
      return absl::StrCat(who(b), " has ", k, "=", v, " but ", who(a), " does not set ", k);
  return "";
}

absl::StatusOr<Rendezvous> rendezvous(const RendezvousOptions& o, Socket* listener) {
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    return absl::InvalidArgumentError(absl::StrCat(
        "--node_rank ", o.node_rank, ": expected 0 <= node_rank < --nnodes ", o.nnodes));
  if (o.local_ranks < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("expert-parallel rendezvous: ", o.local_ranks, " local ranks"));
  const NodeHello mine{.nnodes = o.nnodes,
                       .node_rank = o.node_rank,
                       .local_ranks = o.local_ranks,
                       .world_size = o.world_size,
                       .pid = static_cast<int64_t>(getpid()),
                       .host = this_host(),
                       .settings = o.settings};
  if (o.nnodes == 1) {
    Rendezvous out;
    out.nodes.push_back({.node_rank = 0,
                         .first_rank = 0,
                         .local_ranks = o.local_ranks,
                         .pid = mine.pid,
                         .host = mine.host});
    out.blob = o.blob;
    return out;
  }
  return o.node_rank == 0 ? coordinate(o, mine, listener) : join(o, mine);
}

}  // namespace loom
