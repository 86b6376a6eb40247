// Model::forward in batch-invariant mode, every family: a sequence's logits are bit-identical
// whether it runs alone in one call, beside other sequences, or cut into prefill chunks and
// single-token steps at arbitrary places.
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

std::vector<int32_t> random_ids(int len, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(3, 299);
  std::vector<int32_t> p(len);
  for (int32_t& t : p) t = d(rng);
  return p;
}

// Runs `pieces` (each a list of sequences' token runs) through private caches, one forward per
// piece, and returns every logit row of sequence 0 in order.
struct Seq {
  std::vector<int32_t> ids;
  std::vector<int> cuts;  // token counts of successive calls; sum = ids.size()
};

// Runs the sequences through caches (private SequenceCaches, or pages and slots of a CacheStore
// as the engine uses them), one forward per round: each round takes the next cut of every
// sequence that has one. Returns every logit row of sequence 0 in order.
std::vector<float> run(const Model& m, const std::vector<Seq>& seqs, bool paged) {
  const int64_t page = 64, pages_per_seq = 8;
  CacheStore store(m.config(), {.num_pages = pages_per_seq * static_cast<int64_t>(seqs.size()),
                                .page_size = page,
                                .num_slots = static_cast<int64_t>(seqs.size()) + 1});
  std::vector<SequenceCache> caches;
  std::vector<std::vector<int32_t>> tables(seqs.size());  // page tables the inputs view
  for (size_t i = 0; i < seqs.size(); ++i) {
    caches.push_back(m.new_cache());
    if (paged && store.has_linear()) store.reset_slot(static_cast<int64_t>(i) + 1);
  }
  std::vector<size_t> next(seqs.size(), 0), done(seqs.size(), 0);
  std::vector<float> out;
  const int64_t v = m.config().vocab_size;
  for (;;) {
    ForwardBatch b;
    b.batch_invariant = true;
    b.store = &store;
    std::vector<size_t> which;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (next[s] >= seqs[s].cuts.size()) continue;
      const int n = seqs[s].cuts[next[s]++];
      b.token_ids.insert(b.token_ids.end(), seqs[s].ids.begin() + done[s],
                         seqs[s].ids.begin() + done[s] + n);
      SequenceInput in;
      in.num_tokens = n;
      in.logits = LogitsMode::kAll;
      if (paged) {
        in.start = static_cast<int64_t>(done[s]);
        in.slot = static_cast<int32_t>(s) + 1;  // slot 0 stays the scratch slot
        // Pages in reverse order, so page ids and positions do not line up.
        if (tables[s].empty())
          for (int64_t p = 0; p < pages_per_seq; ++p)
            tables[s].push_back(static_cast<int32_t>((s + 1) * pages_per_seq - 1 - p));
        in.pages = tables[s];
      } else {
        in.cache = &caches[s];
      }
      done[s] += n;
      b.seqs.push_back(in);
      which.push_back(s);
    }
    if (which.empty()) break;
    auto logits = m.forward(b);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (which[0] == 0) {
      const int64_t rows = b.seqs[0].num_tokens;
      out.insert(out.end(), logits->data<float>(), logits->data<float>() + rows * v);
    }
  }
  return out;
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

class ModelBatchInvariance : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(ModelBatchInvariance, LogitsBitIdentical) {
  const auto [fixture, paged] = GetParam();
  auto model = Model::load(kFixtures + "/" + fixture);
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(42);
  const std::vector<int32_t> ids = random_ids(157, rng);
  const std::vector<float> alone = run(**model, {{ids, {157}}}, paged);
  // Beside two other sequences (one longer, one a single token).
  const std::vector<float> beside =
      run(**model, {{ids, {157}}, {random_ids(203, rng), {203}}, {random_ids(1, rng), {1}}}, paged);
  EXPECT_EQ(differing(alone, beside), 0) << "beside other sequences";
  // Cut into chunks at odd places, then token by token, with neighbours cut differently.
  const std::vector<float> cut =
      run(**model, {{ids, {37, 1, 64, 50, 1, 1, 3}}, {random_ids(90, rng), {5, 80, 5}}}, paged);
  EXPECT_EQ(differing(alone, cut), 0) << "chunked at 37/38/102/152/153/154";
}

INSTANTIATE_TEST_SUITE_P(Families, ModelBatchInvariance,
                         ::testing::Combine(::testing::Values("kimi_linear_s1", "deepseek_v3_s1",
                                                              "qwen3_next_s0", "fla_kda_s0"),
                                            ::testing::Bool()));

}  // namespace
}  // namespace loom
