// The expert-parallel nodes' messages (engine/parallel/node_wire.h): every message survives
// encode -> decode with every field, malformed ones are refused with a reason, and the seeds of
// the fuzz target (tests/fuzz/corpus/node_wire) are accepted messages, so the fuzzer starts from
// the decoders' accepting paths.
#include "engine/parallel/node_wire.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace loom {
namespace {

TEST(NodeWire, HelloRoundTrip) {
  const NodeHello h{.nnodes = 3,
                    .node_rank = 2,
                    .local_ranks = 4,
                    .world_size = 12,
                    .pid = 4242,
                    .host = "node-c",
                    .settings = {{"model_type", "kimi_linear"}, {"deterministic", "true"}}};
  const absl::StatusOr<NodeHello> d = decode_hello(encode_hello(h));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->nnodes, 3);
  EXPECT_EQ(d->node_rank, 2);
  EXPECT_EQ(d->local_ranks, 4);
  EXPECT_EQ(d->world_size, 12);
  EXPECT_EQ(d->pid, 4242);
  EXPECT_EQ(d->host, "node-c");
  EXPECT_EQ(d->settings, h.settings);
  // One byte short, or one more: refused.
  const std::string bytes = encode_hello(h);
  EXPECT_FALSE(decode_hello(std::span<const char>(bytes.data(), bytes.size() - 1)).ok());
  EXPECT_FALSE(decode_hello(bytes + "x").ok());
}

TEST(NodeWire, WelcomeChecksTheRankTable) {
  NodeWelcome w{
      .nodes = {{.node_rank = 0, .first_rank = 0, .local_ranks = 2, .pid = 1, .host = "a"},
                {.node_rank = 1, .first_rank = 2, .local_ranks = 1, .pid = 2, .host = "b"}},
      .blob = std::string("\0nccl", 5)};
  absl::StatusOr<NodeWelcome> d = decode_welcome(encode_welcome(w));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->nodes.size(), 2u);
  EXPECT_EQ(d->nodes[1].first_rank, 2);
  EXPECT_EQ(d->nodes[1].host, "b");
  EXPECT_EQ(d->blob, w.blob);
  w.nodes[1].first_rank = 3;  // a gap in the ranks
  d = decode_welcome(encode_welcome(w));
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("expected node 1 from rank 2"), std::string::npos)
      << d.status();
}

TEST(NodeWire, PostRoundTripAndSizeChecks) {
  const std::vector<int64_t> c0{1, 0, 2, 2, 1, 0}, c1{0, 0, 0, 0, 0, 3};
  const std::string rows(24, 'r');
  const CollectivePost a{.op = CollectiveOp::kAllToAll,
                         .seq = 9,
                         .send = rows.data(),
                         .dtype = DType::kF32,
                         .row_bytes = 8,
                         .send_rows = 3,
                         .recv_rows = 3,
                         .send_counts = {c0.data(), 3},
                         .recv_counts = {c0.data() + 3, 3}};
  CollectivePost b = a;
  b.send_rows = 0;  // a rank that sends nothing
  b.send_counts = {c1.data(), 3};
  b.recv_counts = {c1.data() + 3, 3};
  const std::vector<CollectivePost> posts{a, b};
  const std::string bytes = encode_post(posts, 3);
  absl::StatusOr<NodePost> d = decode_post(bytes, 2, 3);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->posts[0].seq, 9u);
  EXPECT_EQ(d->posts[0].op, CollectiveOp::kAllToAll);
  EXPECT_EQ(std::vector<int64_t>(d->posts[0].send_counts.begin(), d->posts[0].send_counts.end()),
            std::vector<int64_t>({1, 0, 2}));
  EXPECT_EQ(d->posts[1].recv_rows, 3);
  EXPECT_EQ(std::string(d->posts[0].send, 24), rows);
  EXPECT_EQ(encode_post(d->posts, 3), bytes);
  EXPECT_FALSE(decode_post(bytes, 1, 3).ok());  // another node's rank count
  EXPECT_FALSE(decode_post(bytes + "extra", 2, 3).ok());
  EXPECT_FALSE(decode_post(std::span<const char>(bytes.data(), bytes.size() - 1), 2, 3).ok());
}

TEST(NodeWire, FrameHeaderAndStatus) {
  const std::string h = encode_frame_header(NodeFrame::kReply, 77);
  ASSERT_EQ(h.size(), kNodeFrameHeaderBytes);
  absl::StatusOr<NodeFrameHeader> d = decode_frame_header(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->type, NodeFrame::kReply);
  EXPECT_EQ(d->payload_bytes, 77u);
  EXPECT_FALSE(decode_frame_header(encode_frame_header(NodeFrame::kReply, uint64_t{1} << 40)).ok());
  std::string bad = h;
  bad[0] = 'X';
  EXPECT_NE(decode_frame_header(bad).status().message().find("bad magic"), std::string::npos);
  const absl::StatusOr<absl::Status> st =
      decode_status(encode_status(absl::DeadlineExceededError("rank 1 waited")));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st->message(), "rank 1 waited");
}

TEST(NodeWire, FuzzSeedsAreAcceptedMessages) {
  const std::filesystem::path dir =
      std::filesystem::path(LOOM_SOURCE_DIR) / "tests/fuzz/corpus/node_wire";
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(b.empty());
    const std::span<const char> body(b.data() + 1, b.size() - 1);
    bool ok = false;
    switch (b[0] % 6) {
      case 0:
        ok = decode_frame_header(body).ok();
        break;
      case 1:
        ok = decode_hello(body).ok();
        break;
      case 2:
        ok = decode_welcome(body).ok();
        break;
      case 3:
        ok = decode_status(body).ok();
        break;
      case 4:
        ok = decode_post(body.subspan(2), 1 + b[1] % 4, 1 + b[2] % 8).ok();
        break;
      case 5:
        ok = decode_reply(body).ok();
        break;
    }
    EXPECT_TRUE(ok) << e.path();
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

}  // namespace
}  // namespace loom
