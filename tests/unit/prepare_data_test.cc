// prepare_token_shard: text files become a shard whose documents decode back to the text they
// came from (per file or per paragraph), with the counts it reports; bad inputs write nothing.
#include "trainer/prepare_data.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"
#include "trainer/token_shard.h"

namespace loom {
namespace {

std::string tmp(const std::string& name) {
  return std::string(LOOM_TEST_TMPDIR) + "/prep." + std::to_string(::getpid()) + "." + name;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = tmp(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::string> decode_docs(const Tokenizer& tok, const TokenShard& shard) {
  std::vector<std::string> out;
  for (int64_t d = 0; d < shard.num_docs(); ++d) {
    std::vector<int32_t> ids(shard.doc_begin(d + 1) - shard.doc_begin(d));
    shard.read(shard.doc_begin(d), ids);
    auto text = tok.decode(ids);
    EXPECT_TRUE(text.ok());
    out.push_back(text.ok() ? *text : "");
  }
  return out;
}

TEST(PrepareData, DocumentsDecodeBackToTheirText) {
  const std::string a =
      "First paragraph, line one.\nLine two.\n\n  \nSecond paragraph <|im_end|>.\n";
  const std::string b = "Ünïcode text: 数据 and more.";
  const std::vector<std::string> inputs = {write_file("a.txt", a), write_file("b.txt", b),
                                           write_file("empty.txt", "")};
  auto qwen = Tokenizer::from_dir(loom::testing::kFixtures + "/tokenizer_qwen");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  for (const Tokenizer* tok : {Tokenizer::byte_level().release(), qwen->get()}) {
    const std::string out = tmp("shard");
    auto per_file = prepare_token_shard(*tok, inputs, DocumentSplit::kFile, out);
    ASSERT_TRUE(per_file.ok()) << per_file.status();
    EXPECT_EQ(per_file->files, 3);
    EXPECT_EQ(per_file->documents, 2);  // the empty file gives no document
    EXPECT_EQ(per_file->bytes, static_cast<int64_t>(a.size() + b.size()));
    auto shard = TokenShard::open(out);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->num_tokens(), per_file->tokens);
    EXPECT_EQ(decode_docs(*tok, *shard), (std::vector<std::string>{a, b}));

    auto per_paragraph = prepare_token_shard(*tok, inputs, DocumentSplit::kParagraph, out);
    ASSERT_TRUE(per_paragraph.ok()) << per_paragraph.status();
    shard = TokenShard::open(out);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(decode_docs(*tok, *shard),
              (std::vector<std::string>{"First paragraph, line one.\nLine two.",
                                        "Second paragraph <|im_end|>.", b}));
    std::remove(out.c_str());
    if (tok != qwen->get()) delete tok;
  }
}

TEST(PrepareData, AMissingInputWritesNothing) {
  const std::string out = tmp("never");
  auto st = prepare_token_shard(*Tokenizer::byte_level(), {tmp("missing.txt")},
                                DocumentSplit::kFile, out);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.status().message().find("missing.txt"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(prepare_token_shard(*Tokenizer::byte_level(), {}, DocumentSplit::kFile, out).ok());
}

}  // namespace
}  // namespace loom
