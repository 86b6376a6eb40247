// The host side of the decode graphs (engine/decode_graphs.h): the batch-size ladder, the
// page-table widths, and padding rows in a store-backed forward (which the CPU runs eagerly):
// the real rows' logits are bit for bit the unpadded batch's in batch-invariant numerics, and a
// batch that abuses padding is refused before anything runs. The graphs themselves need a GPU
// (tests/gpu/model_graphs_cuda_test.cc); here they are refused on the host.
#include "engine/decode_graphs.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model_runner.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

TEST(DecodeBuckets, Ladder) {
  EXPECT_EQ(decode_buckets(256),
            (std::vector<int32_t>{1,  2,  3,  4,  5,  6,   7,   8,   12,  16,
                                  24, 32, 48, 64, 96, 128, 160, 192, 224, 256}));
  EXPECT_EQ(decode_buckets(64),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64}));
  EXPECT_EQ(decode_buckets(100),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 100}));
  EXPECT_EQ(decode_buckets(10), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 10}));
  EXPECT_EQ(decode_buckets(1), (std::vector<int32_t>{1}));
  EXPECT_TRUE(decode_buckets(0).empty());

  const std::vector<int32_t> b = decode_buckets(256);
  EXPECT_EQ(bucket_for(b, 1), 1);
  EXPECT_EQ(bucket_for(b, 8), 8);
  EXPECT_EQ(bucket_for(b, 9), 12);
  EXPECT_EQ(bucket_for(b, 13), 16);
  EXPECT_EQ(bucket_for(b, 65), 96);
  EXPECT_EQ(bucket_for(b, 256), 256);
  EXPECT_EQ(bucket_for(b, 257), 0);
}

TEST(DecodeBuckets, PageColumns) {
  EXPECT_EQ(graph_page_cols(0, 1000), kMinGraphPageCols);
  EXPECT_EQ(graph_page_cols(1, 1000), 16);
  EXPECT_EQ(graph_page_cols(16, 1000), 16);
  EXPECT_EQ(graph_page_cols(17, 1000), 32);
  EXPECT_EQ(graph_page_cols(600, 1000), 1000);  // capped at the reserved width
  EXPECT_EQ(graph_page_cols(17, 20), 20);
  EXPECT_EQ(graph_page_cols(3, 8), 8);
  EXPECT_EQ(graph_page_cols(21, 20), 0);  // wider than the step data: no graph
}

// Three sequences prefilled, then one decode step run unpadded and padded to 8 rows with a
// 16-column page table: the real rows' logits are bit-identical (batch-invariant numerics), and
// what the fillers wrote stays in the scratch slot and page.
TEST(DecodePadding, RealRowsUnchangedByPadding) {
  for (const char* fixture : {"kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1", "fla_kda_s0"}) {
    SCOPED_TRACE(fixture);
    auto loaded = Model::load(loom::testing::kFixtures + "/" + fixture);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const Model& model = **loaded;
    CacheStore::Options opt;
    opt.num_pages = 1 + 3 * 4;
    opt.page_size = 16;
    opt.num_slots = 4;
    // Two identical stores: the unpadded and the padded run each advance their own.
    CacheStore a(model.config(), opt), b(model.config(), opt);
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> tok(3, model.config().vocab_size - 1);
    std::vector<std::vector<int32_t>> tables(3);
    ForwardBatch prefill;
    prefill.batch_invariant = true;
    for (int i = 0; i < 3; ++i) {
      for (int p = 0; p < 4; ++p) tables[i].push_back(1 + i * 4 + p);
      SequenceInput in;
      in.num_tokens = 5 + 9 * i;
      in.slot = i + 1;
      in.pages = tables[i];
      for (int t = 0; t < in.num_tokens; ++t) prefill.token_ids.push_back(tok(rng));
      prefill.seqs.push_back(in);
    }
    for (CacheStore* s : {&a, &b}) {
      prefill.store = s;
      ASSERT_TRUE(model.forward(prefill).ok());
    }
    ForwardBatch decode;
    decode.batch_invariant = true;
    for (int i = 0; i < 3; ++i) {
      SequenceInput in = prefill.seqs[i];
      in.start = in.num_tokens;
      in.num_tokens = 1;
      decode.seqs.push_back(in);
      decode.token_ids.push_back(tok(rng));
    }
    decode.store = &a;
    absl::StatusOr<Tensor> plain = model.forward(decode);
    ASSERT_TRUE(plain.ok()) << plain.status();

    static const int32_t scratch[1] = {CacheStore::kScratchPage};
    ForwardBatch padded = decode;
    padded.store = &b;
    padded.page_cols = 16;
    for (int i = 3; i < 8; ++i) {
      SequenceInput in;
      in.num_tokens = 1;
      in.slot = CacheStore::kScratchSlot;
      in.pages = scratch;
      in.padding = true;
      padded.seqs.push_back(in);
      padded.token_ids.push_back(0);
    }
    absl::StatusOr<Tensor> got = model.forward(padded);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->dim(0), 8);
    const Tensor real = got->slice(0, 0, 3);
    ASSERT_EQ(real.shape(), plain->shape());
    EXPECT_EQ(std::memcmp(real.raw(), plain->raw(), plain->nbytes()), 0);

    // Padding that is not the scratch slot and page, or a real row in the scratch slot beside
    // fillers, is refused.
    ForwardBatch bad = padded;
    bad.seqs[4].start = 3;
    EXPECT_FALSE(model.forward(bad).ok());
    if (a.has_linear()) {
      bad = padded;
      bad.seqs[5].slot = 2;
      EXPECT_FALSE(model.forward(bad).ok());
      bad = padded;
      bad.seqs[0].slot = CacheStore::kScratchSlot;
      EXPECT_FALSE(model.forward(bad).ok());
    }
  }
}

// On the host there are no graphs: the runner refuses them, and an engine asked for them (the
// default) serves eagerly.
TEST(DecodeGraphsHost, RefusedByTheRunnerIgnoredByTheEngine) {
  auto loaded = Model::load(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  CacheStore::Options opt;
  opt.num_pages = 4;
  opt.page_size = 16;
  opt.num_slots = 2;
  CacheStore store((*loaded)->config(), opt);
  ModelRunner runner(**loaded, store, false);
  const StepShape largest{16, 2, 2, 3};
  runner.reserve(largest);
  EXPECT_EQ(runner.enable_decode_graphs(largest).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner.decode_graphs(), nullptr);

  EngineOptions eo;
  eo.cache_budget_bytes = int64_t{16} << 20;
  ASSERT_TRUE(eo.cuda_graphs);
  auto engine = Engine::create(std::move(*loaded), nullptr, eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->graph_capture().has_value());
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 3;
  greedy.ignore_eos = true;
  auto s = (*engine)->submit(Request{{5, 6, 7}, greedy});
  ASSERT_TRUE(s.ok());
  size_t tokens = 0;
  while (auto ev = (*s)->next()) tokens += ev->token_ids.size();
  EXPECT_EQ(tokens, 3u);
}

}  // namespace
}  // namespace loom
