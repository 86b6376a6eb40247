#include "engine/parallel/node_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace loom {
namespace {

constexpr char kMagic[4] = {'L', 'M', 'N', 'D'};
constexpr uint32_t kMaxString = 1u << 20;    // a host name, a setting, an error message
constexpr uint32_t kMaxSettings = 1u << 12;  // settings in a hello
constexpr int32_t kMaxRanks = 1 << 20;       // nodes or ranks in a group

class Writer {
 public:
  template <typename T>
  void put(T v) {
    // Little-endian on the wire; every supported host is little-endian, so this is a copy.
    static_assert(std::is_integral_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void raw(const char* p, size_t n) { out_.append(p, n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::span<const char> in) : in_(in) {}
  template <typename T>
  absl::Status get(T* v, const char* what) {
    if (in_.size() - at_ < sizeof(T)) return short_of(what);
    std::memcpy(v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status str(std::string* s, const char* what) {
    uint32_t n = 0;
    if (absl::Status st = get(&n, what); !st.ok()) return st;
    if (n > kMaxString)
      return absl::InvalidArgumentError(
          absl::StrCat("node message: ", what, " of ", n, " bytes (at most ", kMaxString, ")"));
    if (in_.size() - at_ < n) return short_of(what);
    s->assign(in_.data() + at_, n);
    at_ += n;
    return absl::OkStatus();
  }
  size_t left() const { return in_.size() - at_; }
  std::span<const char> rest() const { return in_.subspan(at_); }
  absl::Status end(const char* what) const {
    if (left() != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("node message: ", left(), " bytes after the end of the ", what));
    return absl::OkStatus();
  }

 private:
  absl::Status short_of(const char* what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("node message: truncated at ", what, " (", left(), " bytes left)"));
  }
  std::span<const char> in_;
  size_t at_ = 0;
};

#define LOOM_WIRE(expr)                  \
  do {                                   \
    absl::Status wire_st_ = (expr);      \
    if (!wire_st_.ok()) return wire_st_; \
  } while (0)

absl::Status check_count(int64_t v, int64_t hi, const char* what) {
  if (v < 0 || v > hi)
    return absl::InvalidArgumentError(
        absl::StrCat("node message: ", what, " ", v, " outside [0, ", hi, "]"));
  return absl::OkStatus();
}

// a * b into *out, false on overflow or a negative factor.
bool mul(int64_t a, int64_t b, int64_t* out) {
  return a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, out);
}

}  // namespace

const char* node_frame_name(NodeFrame type) {
  switch (type) {
    case NodeFrame::kHello:
      return "hello";
    case NodeFrame::kWelcome:
      return "welcome";
    case NodeFrame::kReject:
      return "reject";
    case NodeFrame::kPost:
      return "post";
    case NodeFrame::kReply:
      return "reply";
    case NodeFrame::kAbort:
      return "abort";
    case NodeFrame::kHeartbeat:
      return "heartbeat";
    case NodeFrame::kBye:
      return "bye";
  }
  return "unknown";
}

std::string encode_frame_header(NodeFrame type, uint64_t payload_bytes) {
  Writer w;
  w.raw(kMagic, 4);
  w.put(static_cast<uint8_t>(type));
  w.put(uint8_t{0});
  w.put(uint16_t{0});
  w.put(payload_bytes);
  return w.take();
}

absl::StatusOr<NodeFrameHeader> decode_frame_header(std::span<const char> bytes) {
  if (bytes.size() != kNodeFrameHeaderBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("node frame header of ", bytes.size(), " bytes"));
  if (std::memcmp(bytes.data(), kMagic, 4) != 0)
    return absl::InvalidArgumentError(
        "node frame: bad magic (not a Loom expert-parallel node, or the stream lost its place)");
  Reader r(bytes.subspan(4));
  uint8_t type = 0, pad8 = 0;
  uint16_t pad16 = 0;
  NodeFrameHeader h;
  LOOM_WIRE(r.get(&type, "frame type"));
  LOOM_WIRE(r.get(&pad8, "frame header"));
  LOOM_WIRE(r.get(&pad16, "frame header"));
  LOOM_WIRE(r.get(&h.payload_bytes, "frame length"));
  if (type < static_cast<uint8_t>(NodeFrame::kHello) ||
      type > static_cast<uint8_t>(NodeFrame::kBye))
    return absl::InvalidArgumentError(absl::StrCat("node frame: unknown type ", type));
  if (pad8 != 0 || pad16 != 0)
    return absl::InvalidArgumentError("node frame: nonzero reserved header bytes");
  if (h.payload_bytes > kMaxNodeFramePayload)
    return absl::InvalidArgumentError(absl::StrCat("node frame: payload of ", h.payload_bytes,
                                                   " bytes (at most ", kMaxNodeFramePayload, ")"));
  h.type = static_cast<NodeFrame>(type);
  return h;
}

std::string encode_hello(const NodeHello& m) {
  Writer w;
  w.put(m.protocol);
  w.put(m.nnodes);
  w.put(m.node_rank);
  w.put(m.local_ranks);
  w.put(m.world_size);
  w.put(m.pid);
  w.str(m.host);
  w.put(static_cast<uint32_t>(m.settings.size()));
  for (const auto& [k, v] : m.settings) {
    w.str(k);
    w.str(v);
  }
  return w.take();
}

absl::StatusOr<NodeHello> decode_hello(std::span<const char> payload) {
  Reader r(payload);
  NodeHello m;
  LOOM_WIRE(r.get(&m.protocol, "protocol"));
  // A node of another version may lay out the rest differently: only the version is read.
  if (m.protocol != kNodeProtocolVersion) return m;
  LOOM_WIRE(r.get(&m.nnodes, "nnodes"));
  LOOM_WIRE(r.get(&m.node_rank, "node_rank"));
  LOOM_WIRE(r.get(&m.local_ranks, "local ranks"));
  LOOM_WIRE(r.get(&m.world_size, "world size"));
  LOOM_WIRE(r.get(&m.pid, "pid"));
  LOOM_WIRE(r.str(&m.host, "host"));
  LOOM_WIRE(check_count(m.nnodes, kMaxRanks, "nnodes"));
  LOOM_WIRE(check_count(m.node_rank, kMaxRanks, "node_rank"));
  LOOM_WIRE(check_count(m.local_ranks, kMaxRanks, "local ranks"));
  LOOM_WIRE(check_count(m.world_size, kMaxRanks, "world size"));
  uint32_t n = 0;
  LOOM_WIRE(r.get(&n, "settings"));
  if (n > kMaxSettings)
    return absl::InvalidArgumentError(absl::StrCat("node hello: ", n, " settings"));
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    LOOM_WIRE(r.str(&k, "setting name"));
    LOOM_WIRE(r.str(&v, "setting value"));
    m.settings.emplace_back(std::move(k), std::move(v));
  }
  LOOM_WIRE(r.end("hello"));
  return m;
}

std::string describe_node(const NodeInfo& n) {
  return absl::StrCat("node ", n.node_rank, " (", n.host, ", pid ", n.pid, ", ranks ", n.first_rank,
                      "..", n.first_rank + n.local_ranks - 1, ")");
}

std::string encode_welcome(const NodeWelcome& m) {
  Writer w;
  w.put(static_cast<uint32_t>(m.nodes.size()));
  for (const NodeInfo& n : m.nodes) {
    w.put(n.node_rank);
    w.put(n.first_rank);
    w.put(n.local_ranks);
    w.put(n.pid);
    w.str(n.host);
  }
  w.str(m.blob);
  return w.take();
}

absl::StatusOr<NodeWelcome> decode_welcome(std::span<const char> payload) {
  Reader r(payload);
  NodeWelcome m;
  uint32_t n = 0;
  LOOM_WIRE(r.get(&n, "node count"));
  // Each node takes at least 24 bytes: a count beyond that is a lie, refused before reserving.
  if (n > kMaxRanks || n > r.left() / 24)
    return absl::InvalidArgumentError(absl::StrCat("node welcome: ", n, " nodes"));
  int64_t next_rank = 0;
  for (uint32_t i = 0; i < n; ++i) {
    NodeInfo info;
    LOOM_WIRE(r.get(&info.node_rank, "node rank"));
    LOOM_WIRE(r.get(&info.first_rank, "first rank"));
    LOOM_WIRE(r.get(&info.local_ranks, "local ranks"));
    LOOM_WIRE(r.get(&info.pid, "pid"));
    LOOM_WIRE(r.str(&info.host, "host"));
    // Node order, consecutive ranks, at least one each: what every node relies on.
    if (info.node_rank != static_cast<int32_t>(i) || info.first_rank != next_rank ||
        info.local_ranks < 1 || info.local_ranks > kMaxRanks)
      return absl::InvalidArgumentError(
          absl::StrCat("node welcome: entry ", i, " is node ", info.node_rank, " with ranks from ",
                       info.first_rank, " (", info.local_ranks, " of them), expected node ", i,
                       " from rank ", next_rank));
    next_rank += info.local_ranks;
    m.nodes.push_back(std::move(info));
  }
  if (next_rank > kMaxRanks)
    return absl::InvalidArgumentError(absl::StrCat("node welcome: ", next_rank, " ranks"));
  LOOM_WIRE(r.str(&m.blob, "blob"));
  LOOM_WIRE(r.end("welcome"));
  return m;
}

std::string encode_status(const absl::Status& st) {
  Writer w;
  w.put(static_cast<int32_t>(st.code()));
  w.str(std::string(st.message()));
  return w.take();
}

absl::StatusOr<absl::Status> decode_status(std::span<const char> payload) {
  Reader r(payload);
  int32_t code = 0;
  std::string message;
  LOOM_WIRE(r.get(&code, "status code"));
  LOOM_WIRE(r.str(&message, "status message"));
  LOOM_WIRE(r.end("status"));
  // An OK or unknown code from a peer still means failure: Unknown keeps the message.
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated))
    code = static_cast<int32_t>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

std::string encode_post(std::span<const CollectivePost> posts, int world) {
  Writer w;
  const CollectivePost& a = posts[0];
  w.put(a.seq);
  w.put(static_cast<uint8_t>(a.op));
  w.put(static_cast<uint8_t>(a.dtype));
  w.put(a.row_bytes);
  w.put(static_cast<uint32_t>(posts.size()));
  for (const CollectivePost& p : posts) {
    w.put(p.send_rows);
    w.put(p.recv_rows);
    if (a.op == CollectiveOp::kAllToAll)
      for (int q = 0; q < world; ++q) w.put(p.send_counts[q]);
    if (a.op == CollectiveOp::kAllToAll)
      for (int q = 0; q < world; ++q) w.put(p.recv_counts[q]);
  }
  for (const CollectivePost& p : posts)
    if (p.send_rows > 0) w.raw(p.send, static_cast<size_t>(p.send_rows * p.row_bytes));
  return w.take();
}

absl::StatusOr<NodePost> decode_post(std::span<const char> payload, int local_ranks, int world) {
  Reader r(payload);
  CollectivePost a;
  uint8_t op = 0, dtype = 0;
  uint32_t n = 0;
  LOOM_WIRE(r.get(&a.seq, "sequence number"));
  LOOM_WIRE(r.get(&op, "op"));
  LOOM_WIRE(r.get(&dtype, "dtype"));
  LOOM_WIRE(r.get(&a.row_bytes, "row bytes"));
  LOOM_WIRE(r.get(&n, "posts"));
  if (op < static_cast<uint8_t>(CollectiveOp::kAllGather) ||
      op > static_cast<uint8_t>(CollectiveOp::kAllToAll))
    return absl::InvalidArgumentError(absl::StrCat("node post: unknown collective ", op));
  if (dtype > static_cast<uint8_t>(DType::kF8E5M2))
    return absl::InvalidArgumentError(absl::StrCat("node post: unknown dtype ", dtype));
  a.op = static_cast<CollectiveOp>(op);
  a.dtype = static_cast<DType>(dtype);
  LOOM_WIRE(check_count(a.row_bytes, int64_t{1} << 40, "row bytes"));
  if (static_cast<int64_t>(n) != local_ranks)
    return absl::InvalidArgumentError(
        absl::StrCat("node post: ", n, " ranks' posts from a node of ", local_ranks));
  NodePost out;
  out.posts.assign(n, a);
  out.counts.resize(n);
  int64_t data = 0;
  for (uint32_t i = 0; i < n; ++i) {
    CollectivePost& p = out.posts[i];
    LOOM_WIRE(r.get(&p.send_rows, "send rows"));
    LOOM_WIRE(r.get(&p.recv_rows, "recv rows"));
    LOOM_WIRE(check_count(p.send_rows, int64_t{1} << 40, "send rows"));
    LOOM_WIRE(check_count(p.recv_rows, int64_t{1} << 40, "recv rows"));
    if (a.op == CollectiveOp::kAllToAll) {
      if (r.left() / sizeof(int64_t) < 2 * static_cast<size_t>(world))
        return absl::InvalidArgumentError("node post: truncated all_to_all counts");
      std::vector<int64_t>& c = out.counts[i];
      c.resize(2 * static_cast<size_t>(world));
      int64_t sent = 0, received = 0;
      for (int q = 0; q < 2 * world; ++q) {
        LOOM_WIRE(r.get(&c[q], "all_to_all count"));
        LOOM_WIRE(check_count(c[q], int64_t{1} << 40, "all_to_all count"));
        (q < world ? sent : received) += c[q];
      }
      if (sent != p.send_rows || received != p.recv_rows)
        return absl::InvalidArgumentError(
            absl::StrCat("node post: all_to_all counts sum to ", sent, " sent and ", received,
                         " received rows, the post says ", p.send_rows, " and ", p.recv_rows));
      p.send_counts = std::span<const int64_t>(c.data(), world);
      p.recv_counts = std::span<const int64_t>(c.data() + world, world);
    }
    int64_t bytes = 0;
    if (!mul(p.send_rows, a.row_bytes, &bytes) || __builtin_add_overflow(data, bytes, &data))
      return absl::InvalidArgumentError("node post: send sizes overflow");
  }
  if (static_cast<uint64_t>(data) != r.left())
    return absl::InvalidArgumentError(
        absl::StrCat("node post: ", r.left(), " bytes of rows, the posts describe ", data));
  const char* at = r.rest().data();
  for (CollectivePost& p : out.posts) {
    p.send = at;
    at += p.send_rows * a.row_bytes;
  }
  return out;
}

std::string encode_reply_header(uint64_t seq) {
  Writer w;
  w.put(seq);
  return w.take();
}

absl::StatusOr<NodeReply> decode_reply(std::span<const char> payload) {
  Reader r(payload);
  NodeReply m;
  LOOM_WIRE(r.get(&m.seq, "sequence number"));
  m.data = r.rest();
  return m;
}

}  // namespace loom
