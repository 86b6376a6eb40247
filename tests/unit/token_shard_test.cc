// Token shards (trainer/token_shard.h): what a writer writes reads back exactly, in both token
// widths; every malformed file is rejected with a message naming what is wrong, never read.
#include "trainer/token_shard.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom {
namespace {

std::string tmp_path(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/" + name + "." + std::to_string(::getpid());
}

std::vector<std::vector<int32_t>> random_docs(std::mt19937& rng, int32_t max_id) {
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int32_t> id(0, max_id);
  std::vector<std::vector<int32_t>> docs(13);
  for (auto& d : docs) {
    d.resize(len(rng));
    for (int32_t& t : d) t = id(rng);
  }
  docs[4].clear();  // an empty document is kept as one
  return docs;
}

TEST(TokenShard, RoundTripsInBothWidths) {
  std::mt19937 rng(1);
  for (int32_t max_id : {65535, 200000}) {
    const auto docs = random_docs(rng, max_id);
    TokenShardWriter w;
    int32_t most = 0;
    for (const auto& d : docs) {
      ASSERT_TRUE(w.add_document(d).ok());
      for (int32_t t : d) most = std::max(most, t);
    }
    const std::string path = tmp_path("shard" + std::to_string(max_id));
    ASSERT_TRUE(w.write(path).ok());
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
    auto s = TokenShard::open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->token_bytes(), most < 65536 ? 2 : 4);
    ASSERT_EQ(s->num_docs(), static_cast<int64_t>(docs.size()));
    EXPECT_EQ(s->max_token(), most);
    int64_t at = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      ASSERT_EQ(s->doc_begin(d), at);
      std::vector<int32_t> got(docs[d].size());
      s->read(at, got);
      EXPECT_EQ(got, docs[d]) << d;
      at += static_cast<int64_t>(docs[d].size());
    }
    EXPECT_EQ(s->doc_begin(s->num_docs()), s->num_tokens());
    EXPECT_EQ(s->num_tokens(), at);
    std::remove(path.c_str());
  }
}

absl::Status parse(std::string bytes) {
  return TokenShard::parse(MappedFile::from_bytes(std::move(bytes), "t.shard")).status();
}

void expect_rejected(const std::string& bytes, const std::string& what) {
  const absl::Status st = parse(bytes);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
}

void put_u64(std::string& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST(TokenShard, RejectsEveryMalformedFile) {
  TokenShardWriter w;
  ASSERT_TRUE(w.add_document(std::vector<int32_t>{5, 6, 7}).ok());
  ASSERT_TRUE(w.add_document(std::vector<int32_t>{8}).ok());
  const std::string good = w.serialize();
  ASSERT_TRUE(parse(good).ok());
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(parse(good.substr(0, n)).ok()) << "truncated to " << n;
  expect_rejected(good + "x", "the header implies");
  std::string b = good;
  b[0] = 'X';
  expect_rejected(b, "magic");
  b = good;
  b[8] = 2;
  expect_rejected(b, "version 2");
  b = good;
  b[12] = 3;
  expect_rejected(b, "token width 3");
  b = good;
  put_u64(b, 16, ~uint64_t{0});
  expect_rejected(b, "cannot fit");
  b = good;
  put_u64(b, 24, uint64_t{1} << 62);
  expect_rejected(b, "cannot fit");
  b = good;
  put_u64(b, 32, 1);  // first offset not 0
  expect_rejected(b, "document offset 0");
  b = good;
  put_u64(b, 40, 5);  // beyond num_tokens
  expect_rejected(b, "document offset 1");
  b = good;
  put_u64(b, 48, 3);  // last offset != num_tokens
  expect_rejected(b, "document offset 2");
  EXPECT_EQ(TokenShard::open(tmp_path("missing")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(w.write("/nonexistent-dir/x.shard").ok());
  EXPECT_EQ(w.add_document(std::vector<int32_t>{1, -2}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
