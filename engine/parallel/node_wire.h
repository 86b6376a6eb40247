// The messages expert-parallel nodes exchange over TCP (node_rendezvous.h, tcp_communicator.h):
// a fixed frame header, then a payload of little-endian integers and length-prefixed strings.
// Every decoder takes untrusted bytes (another process, possibly another version or something
// that is not Loom at all) and returns InvalidArgument for anything malformed, never reading past
// the bytes given or allocating more than they could describe (tests/fuzz/node_wire_fuzz.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/parallel/collective_post.h"

namespace loom {

// Bumped whenever a message's layout changes: nodes of different versions are refused at the
// rendezvous, naming both.
constexpr uint32_t kNodeProtocolVersion = 1;
// The most a frame's payload may hold (a corrupt or foreign length is refused before anything is
// allocated): 16 GiB, far above what the CPU transport moves per collective.
constexpr uint64_t kMaxNodeFramePayload = uint64_t{1} << 34;
constexpr size_t kNodeFrameHeaderBytes = 16;

enum class NodeFrame : uint8_t {
  kHello = 1,      // node -> coordinator: who it is, what it runs
  kWelcome = 2,    // coordinator -> node: the group's node table and the blob
  kReject = 3,     // coordinator -> node: the rendezvous failed, why
  kPost = 4,       // node -> node 0: a collective's posts of the node's ranks, and their sends
  kReply = 5,      // node 0 -> node: the collective's results for the node's ranks
  kAbort = 6,      // either way: the group failed, why
  kHeartbeat = 7,  // either way: still alive (nothing else sent for a while)
  kBye = 8,        // either way: leaving the group on purpose (finished, or stopping)
};
const char* node_frame_name(NodeFrame type);

struct NodeFrameHeader {
  NodeFrame type = NodeFrame::kHeartbeat;
  uint64_t payload_bytes = 0;
};
// 16 bytes: "LMND", the type, three zero bytes, the payload's length (u64).
std::string encode_frame_header(NodeFrame type, uint64_t payload_bytes);
absl::StatusOr<NodeFrameHeader> decode_frame_header(std::span<const char> bytes);

struct NodeHello {
  uint32_t protocol = kNodeProtocolVersion;
  int32_t nnodes = 0, node_rank = 0;
  int32_t local_ranks = 0, world_size = 0;
  int64_t pid = 0;
  std::string host;
  // What must be equal on every node (the model, the exchange, numerics flags), as key = value.
  std::vector<std::pair<std::string, std::string>> settings;
};
std::string encode_hello(const NodeHello& m);
absl::StatusOr<NodeHello> decode_hello(std::span<const char> payload);

struct NodeInfo {
  int32_t node_rank = 0, first_rank = 0, local_ranks = 0;
  int64_t pid = 0;
  std::string host;  // the name it gave, and the address node 0 saw it connect from
};
// "node R (HOST, pid P, ranks F..L)".
std::string describe_node(const NodeInfo& n);

struct NodeWelcome {
  std::vector<NodeInfo> nodes;  // in node order; first_rank assigned by node 0
  std::string blob;             // opaque: what node 0 gave (an NCCL unique id travels here)
};
std::string encode_welcome(const NodeWelcome& m);
absl::StatusOr<NodeWelcome> decode_welcome(std::span<const char> payload);

// kReject and kAbort: a status code and its message.
std::string encode_status(const absl::Status& st);
absl::StatusOr<absl::Status> decode_status(std::span<const char> payload);

// kPost: one collective's posts of a node's consecutive ranks and, after them, each rank's send
// rows back to back. The decoded posts' counts and sends point into `payload`.
struct NodePost {
  std::vector<CollectivePost> posts;
  std::vector<std::vector<int64_t>> counts;  // per rank: send counts then recv counts (all_to_all)
};
// `posts` of the node's ranks (all of the same op, seq and row size), `world` ranks in the group.
std::string encode_post(std::span<const CollectivePost> posts, int world);
// Checks that the data is exactly what the posts describe (rows x row size, no overflow) and that
// it describes `local_ranks` ranks of a group of `world`.
absl::StatusOr<NodePost> decode_post(std::span<const char> payload, int local_ranks, int world);

// kReply: the sequence number, then the node's ranks' results back to back.
std::string encode_reply_header(uint64_t seq);
struct NodeReply {
  uint64_t seq = 0;
  std::span<const char> data;
};
absl::StatusOr<NodeReply> decode_reply(std::span<const char> payload);

}  // namespace loom
