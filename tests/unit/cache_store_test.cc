// The paged CacheStore path of Model::forward: store-backed sequences (random page tables, state
// slots) give the same logits as private contiguous caches, in prefill, chunked prefill and
// decode, for every mixer type; a copied slot continues exactly like the original; malformed
// store batches are rejected without touching the store, and malformed batches of private caches
// (which the model runs as store sequences) without touching the caches.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    m = std::max(m, static_cast<double>(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// Runs three sequences of different lengths through (a) private caches and (b) the store with
// shuffled page tables, in the chunk sizes given, then 5 decode steps; compares all logits.
void check_model(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  const int vocab = m.config().vocab_size;
  const std::vector<int> lens = {150, 37, 64};
  const std::vector<int> chunks = {50, 1, 64, 200};  // chunk sizes tried in turn
  CacheStore::Options opt;
  opt.num_pages = 40;
  opt.page_size = 16;  // small pages: many page boundaries inside chunks
  opt.num_slots = 5;
  CacheStore store(m.config(), opt);
  std::vector<int32_t> page_ids(opt.num_pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);

  std::vector<std::vector<int32_t>> prompts;
  std::vector<SequenceCache> caches;
  std::vector<SequenceInput> inputs(3);
  size_t next_page = 0;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(random_tokens(lens[i] + 5, vocab, rng));
    caches.push_back(m.new_cache());
    inputs[i].slot = i + 1;
    for (int p = 0; p < (lens[i] + 5 + 15) / 16; ++p)
      inputs[i].pages.push_back(page_ids[next_page++]);
  }
  std::vector<int> done(3, 0);
  for (size_t step = 0; step < 12; ++step) {
    ForwardBatch a, b;
    b.store = &store;
    for (int i = 0; i < 3; ++i) {
      const int total = lens[i] + 5;
      if (done[i] >= total) continue;
      const int n = std::min(done[i] < lens[i] ? chunks[(step + i) % chunks.size()] : 1,
                             (done[i] < lens[i] ? lens[i] : total) - done[i]);
      std::vector<int32_t> toks(prompts[i].begin() + done[i], prompts[i].begin() + done[i] + n);
      a.token_ids.insert(a.token_ids.end(), toks.begin(), toks.end());
      b.token_ids.insert(b.token_ids.end(), toks.begin(), toks.end());
      SequenceInput sa;
      sa.num_tokens = n;
      sa.cache = &caches[i];
      sa.logits = LogitsMode::kAll;
      a.seqs.push_back(sa);
      SequenceInput sb = inputs[i];
      sb.num_tokens = n;
      sb.start = done[i];
      sb.logits = LogitsMode::kAll;
      b.seqs.push_back(sb);
      done[i] += n;
    }
    if (a.seqs.empty()) break;
    absl::StatusOr<Tensor> la = m.forward(a), lb = m.forward(b);
    ASSERT_TRUE(la.ok() && lb.ok()) << la.status() << lb.status();
    // Paged GEMMs split the reduction over positions per page: equal up to f32 rounding.
    EXPECT_LT(max_diff(*la, *lb), 2e-5) << "step " << step;
  }
}

class StoreVsPrivate : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreVsPrivate, SameLogits) {
  auto m = Model::load(kFixtures + "/" + GetParam());
  ASSERT_TRUE(m.ok()) << m.status();
  check_model(**m, 5);
}

INSTANTIATE_TEST_SUITE_P(Families, StoreVsPrivate,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0"));

TEST(CacheStore, CopiedSlotContinuesIdentically) {
  auto m = Model::load(kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(m.ok());
  const ModelConfig& cfg = (*m)->config();
  CacheStore store(cfg, {.num_pages = 8, .page_size = 64, .num_slots = 3});
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = random_tokens(100, cfg.vocab_size, rng);
  ForwardBatch b;
  b.store = &store;
  b.token_ids = prompt;
  SequenceInput in;
  in.num_tokens = 100;
  in.slot = 1;
  in.pages = {3, 5};
  b.seqs = {in};
  ASSERT_TRUE((*m)->forward(b).ok());
  store.copy_slot(1, 2);
  // Continue both: slot 1 with its pages, slot 2 with a copy of the page contents elsewhere.
  // Only the linear state is in the slot; the attention rows are shared through the pages.
  const std::vector<int32_t> next = random_tokens(7, cfg.vocab_size, rng);
  std::vector<Tensor> out;
  for (int32_t slot : {1, 2}) {
    ForwardBatch c;
    c.store = &store;
    c.token_ids = next;
    SequenceInput s;
    s.num_tokens = 7;
    s.start = 100;
    s.slot = slot;
    s.pages = {3, 5};
    s.logits = LogitsMode::kAll;
    c.seqs = {s};
    absl::StatusOr<Tensor> l = (*m)->forward(c);
    ASSERT_TRUE(l.ok()) << l.status();
    out.push_back(*l);
  }
  EXPECT_EQ(max_diff(out[0], out[1]), 0.0);
}

TEST(CacheStore, RejectsBadStoreBatches) {
  auto m = Model::load(kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(m.ok());
  CacheStore store((*m)->config(), {.num_pages = 4, .page_size = 64, .num_slots = 3});
  auto run = [&](auto edit) {
    ForwardBatch b;
    b.store = &store;
    b.token_ids = std::vector<int32_t>(10, 1);
    SequenceInput a;
    a.num_tokens = 5;
    a.slot = 1;
    a.pages = {0};
    SequenceInput c = a;
    c.slot = 2;
    c.pages = {1};
    b.seqs = {a, c};
    edit(b);
    return (*m)->forward(b).status();
  };
  EXPECT_TRUE(run([](ForwardBatch&) {}).ok());
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[1].slot = 1; }).ok());       // slot twice
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[1].pages = {0}; }).ok());    // page written twice
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].slot = 3; }).ok());       // slot out of range
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].pages = {4}; }).ok());    // page out of range
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].pages.clear(); }).ok());  // no page
  EXPECT_FALSE(run([](ForwardBatch& b) { b.store = nullptr; }).ok());
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].start = 64 * 2; }).ok());  // past the pages
  // Sequence 0 continues at position 64: it reads its first page and writes page 3.
  auto reading = [](int32_t page) {
    return [page](ForwardBatch& b) {
      b.seqs[0].start = 64;
      b.seqs[0].pages = {page, 3};
    };
  };
  EXPECT_TRUE(run(reading(2)).ok());
  EXPECT_FALSE(run(reading(1)).ok());  // page 1 is written by sequence 1
}

// Private caches run through a store of their own (one cache) or one staged for the call (several);
// a rejected batch must leave every cache as it was, so caches that also saw rejected batches
// continue bit for bit like caches that never did.
TEST(PrivateCaches, RejectedBatchesLeaveCachesUntouched) {
  auto m = Model::load(kFixtures + "/kimi_linear_s1");  // KDA and MLA layers
  ASSERT_TRUE(m.ok()) << m.status();
  const Model& model = **m;
  const int vocab = model.config().vocab_size;
  std::mt19937 rng(9);
  std::vector<SequenceCache> tried = {model.new_cache(), model.new_cache()};
  std::vector<SequenceCache> clean = {model.new_cache(), model.new_cache()};
  CacheStore store(model.config(), {.num_pages = 4, .page_size = 64, .num_slots = 2});
  auto batch = [](std::vector<SequenceCache>& caches, const std::vector<int32_t>& ids, int64_t n0) {
    ForwardBatch b;
    b.token_ids = ids;
    const int64_t n1 = static_cast<int64_t>(ids.size()) - n0;
    b.seqs.push_back({.num_tokens = n0, .logits = LogitsMode::kAll, .cache = &caches[0]});
    b.seqs.push_back({.num_tokens = n1, .logits = LogitsMode::kAll, .cache = &caches[1]});
    return b;
  };
  // A prefill, then steps that grow the first cache past its capacity.
  for (const auto& [n0, n1] : std::vector<std::pair<int, int>>{{70, 3}, {1, 1}, {2, 1}}) {
    const std::vector<int32_t> ids = random_tokens(n0 + n1, vocab, rng);
    const int64_t had0 = tried[0].num_tokens(), had1 = tried[1].num_tokens();

    ForwardBatch mixed = batch(tried, ids, n0);  // a private cache beside a store sequence
    mixed.store = &store;
    mixed.seqs[1] = {.num_tokens = n1, .slot = 0, .pages = {0}};
    EXPECT_EQ(model.forward(mixed).status().code(), absl::StatusCode::kInvalidArgument);
    std::vector<int32_t> bad_ids = ids;
    bad_ids.back() = vocab;
    EXPECT_FALSE(model.forward(batch(tried, bad_ids, n0)).ok());
    ForwardBatch shared = batch(tried, ids, n0);
    shared.seqs[1].cache = &tried[0];
    EXPECT_FALSE(model.forward(shared).ok());
    // One cache alone is its own store: a rejected long batch may grow it, nothing else.
    ForwardBatch alone;
    alone.token_ids = std::vector<int32_t>(200, vocab);
    alone.seqs.push_back({.num_tokens = 200, .cache = &tried[0]});
    EXPECT_FALSE(model.forward(alone).ok());
    EXPECT_EQ(tried[0].num_tokens(), had0);
    EXPECT_EQ(tried[1].num_tokens(), had1);

    absl::StatusOr<Tensor> a = model.forward(batch(tried, ids, n0));
    absl::StatusOr<Tensor> b = model.forward(batch(clean, ids, n0));
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(max_diff(*a, *b), 0.0);
  }
  EXPECT_EQ(tried[0].num_tokens(), 73);
  EXPECT_EQ(tried[1].num_tokens(), 5);
}

}  // namespace
}  // namespace loom
