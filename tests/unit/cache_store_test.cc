// The paged CacheStore path of Model::forward: store-backed sequences (random page tables, state
// slots) give the same logits as private contiguous caches, in prefill, chunked prefill and
// decode, for every mixer type; a copied slot continues exactly like the original; malformed
// store batches are rejected without touching the store, and malformed batches of private caches
// (which the model runs as store sequences) without touching the caches.
#include <algorithm>
#include <numeric>
#include <random>
#include <span>
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
  std::vector<std::vector<int32_t>> tables(3);  // the inputs view them
  size_t next_page = 0;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(random_tokens(lens[i] + 5, vocab, rng));
    caches.push_back(m.new_cache());
    inputs[i].slot = i + 1;
    for (int p = 0; p < (lens[i] + 5 + 15) / 16; ++p) tables[i].push_back(page_ids[next_page++]);
    inputs[i].pages = tables[i];
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
    // Paged GEMMs split the reduction over positions per page: equal up to f32 rounding, which
    // grows with the logits' scale and with the BLAS kernel OpenBLAS picks for the processor
    // (worst seen: 2.1e-5 at a largest logit of 6.7 with OPENBLAS_CORETYPE=Zen or Haswell, 1.8e-5
    // with SkylakeX), so the bound is relative to the largest logit: 1e-5 of it, about 84 ulps. A
    // wrong page or slot moves logits by O(1).
    double scale = 1.0;
    for (int64_t i = 0; i < la->numel(); ++i)
      scale = std::max(scale, static_cast<double>(std::abs(la->data<float>()[i])));
    EXPECT_LT(max_diff(*la, *lb), 1e-5 * scale) << "step " << step << ", largest logit " << scale;
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
  const int32_t pages[] = {3, 5};
  SequenceInput in;
  in.num_tokens = 100;
  in.slot = 1;
  in.pages = pages;
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
    s.pages = pages;
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
  static const int32_t kPage0[] = {0}, kPage1[] = {1}, kPage4[] = {4};
  static const int32_t kRead2[] = {2, 3}, kRead1[] = {1, 3};
  auto run = [&](auto edit) {
    ForwardBatch b;
    b.store = &store;
    b.token_ids = std::vector<int32_t>(10, 1);
    SequenceInput a;
    a.num_tokens = 5;
    a.slot = 1;
    a.pages = kPage0;
    SequenceInput c = a;
    c.slot = 2;
    c.pages = kPage1;
    b.seqs = {a, c};
    edit(b);
    return (*m)->forward(b).status();
  };
  EXPECT_TRUE(run([](ForwardBatch&) {}).ok());
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[1].slot = 1; }).ok());        // slot twice
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[1].pages = kPage0; }).ok());  // page written twice
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].slot = 3; }).ok());        // slot out of range
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].pages = kPage4; }).ok());  // page out of range
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].pages = {}; }).ok());      // no page
  EXPECT_FALSE(run([](ForwardBatch& b) { b.store = nullptr; }).ok());
  EXPECT_FALSE(run([](ForwardBatch& b) { b.seqs[0].start = 64 * 2; }).ok());  // past the pages
  // Sequence 0 continues at position 64: it reads its first page and writes page 3.
  auto reading = [](std::span<const int32_t> pages) {
    return [pages](ForwardBatch& b) {
      b.seqs[0].start = 64;
      b.seqs[0].pages = pages;
    };
  };
  EXPECT_TRUE(run(reading(kRead2)).ok());
  EXPECT_FALSE(run(reading(kRead1)).ok());  // page 1 is written by sequence 1
}

// The one byte count: per-token KV bytes of each attention layer and per-slot state bytes, by
// hand from the fixtures' config.json.
TEST(CacheStore, BytesFromTheConfig) {
  auto kimi = Model::load(kFixtures + "/kimi_linear_s1");
  auto qwen = Model::load(kFixtures + "/qwen3_next_s0");
  auto dsv3 = Model::load(kFixtures + "/deepseek_v3_s1");
  ASSERT_TRUE(kimi.ok() && qwen.ok() && dsv3.ok());
  // kimi_linear_s1: one MLA layer (kv_lora_rank 48 + qk_rope_head_dim 16), four KDA layers (4
  // heads of 24: recurrent 4*24*24 f32, conv tail 3 x (2*4*24 + 4*24) f32).
  const ModelConfig& k = (*kimi)->config();
  EXPECT_EQ(CacheStore::kv_bytes_per_token(k), (std::vector<int64_t>{(48 + 16) * 4}));
  EXPECT_EQ(CacheStore::kv_bytes_per_token(k, DType::kBF16), (std::vector<int64_t>{(48 + 16) * 2}));
  EXPECT_EQ(CacheStore::page_bytes(k, 64), 256u * 64);
  EXPECT_EQ(CacheStore::page_bytes(k, 16, DType::kBF16), 128u * 16);
  EXPECT_EQ(CacheStore::slot_bytes(k), 4u * (4 * 24 * 24 * 4 + 3 * 288 * 4));
  EXPECT_EQ(CacheStore::slot_bytes(k), 50688u);
  // The conv tail follows the activation dtype; the recurrent state stays f32.
  EXPECT_EQ(CacheStore::slot_bytes(k, DType::kBF16), 4u * (4 * 24 * 24 * 4 + 3 * 288 * 2));
  // qwen3_next_s0: one GQA layer (2 KV heads of 32, keys and values), three Gated DeltaNet
  // layers (4 value heads of 32 over key dim 32; conv channels 2*2*32 + 4*32).
  const ModelConfig& q = (*qwen)->config();
  EXPECT_EQ(CacheStore::kv_bytes_per_token(q), (std::vector<int64_t>{2 * 2 * 32 * 4}));
  EXPECT_EQ(CacheStore::page_bytes(q, 64, DType::kBF16), 256u * 64);
  EXPECT_EQ(CacheStore::slot_bytes(q), 3u * (4 * 32 * 32 * 4 + 3 * 256 * 4));
  // deepseek_v3_s1: three MLA layers (64 + 16), no state.
  const ModelConfig& d = (*dsv3)->config();
  EXPECT_EQ(CacheStore::kv_bytes_per_token(d), (std::vector<int64_t>{320, 320, 320}));
  EXPECT_EQ(CacheStore::page_bytes(d, 64), 960u * 64);
  EXPECT_EQ(CacheStore::slot_bytes(d), 0u);
  // The pools hold exactly what the counts say.
  CacheStore store(k, {.num_pages = 3, .page_size = 16, .num_slots = 2});
  size_t pool_bytes = 0, state_bytes = 0;
  for (int l = 0; l < k.num_layers; ++l) {
    if (k.mixers[l] == MixerType::kMla)
      pool_bytes += store.pool(l, 0).nbytes() + store.pool(l, 1).nbytes();
    if (k.mixers[l] == MixerType::kKda)
      state_bytes += store.recurrent_states(l).nbytes() + store.conv_states(l).nbytes();
  }
  EXPECT_EQ(pool_bytes, 3 * CacheStore::page_bytes(k, 16));
  EXPECT_EQ(state_bytes, 2 * CacheStore::slot_bytes(k));
}

TEST(CacheStore, CreateChecksDeviceAndDtypes) {
  auto m = Model::load(kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(m.ok());
  const ModelConfig& cfg = (*m)->config();
  CacheStore::Options opt{.num_pages = 2, .page_size = 8, .num_slots = 2};
  auto ok = CacheStore::create(cfg, opt);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->device(), Device::kCpu);
  EXPECT_EQ((*ok)->kv_dtype(), DType::kF32);
  EXPECT_EQ((*ok)->pool(2, 0).dtype(), DType::kF32);
  EXPECT_EQ((*ok)->recurrent_states(0).dtype(), DType::kF32);
  EXPECT_EQ((*ok)->conv_states(0).dtype(), DType::kF32);
  // New pools are zero.
  for (const Tensor& t :
       {(*ok)->pool(2, 0), (*ok)->pool(2, 1), (*ok)->recurrent_states(0), (*ok)->conv_states(4)})
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<float>()[i], 0.0f);

  // bf16 pages (--kv_dtype bf16): half the bytes a page, zeroed; the states stay f32.
  opt.kv_dtype = DType::kBF16;
  auto bf16 = CacheStore::create(cfg, opt);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->pool(2, 0).dtype(), DType::kBF16);
  EXPECT_EQ((*bf16)->recurrent_states(0).dtype(), DType::kF32);
  EXPECT_EQ(CacheStore::page_bytes(cfg, 4, DType::kBF16) * 2, CacheStore::page_bytes(cfg, 4));
  for (const Tensor& t : {(*bf16)->pool(2, 0), (*bf16)->pool(2, 1)})
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<uint16_t>()[i], 0);
  opt.kv_dtype = DType::kF16;
  EXPECT_EQ(CacheStore::create(cfg, opt).status().message(),
            "CacheStore: kv_dtype f16 on cpu: use f32, bf16 or fp8");
  opt.kv_dtype = DType::kF32;
  opt.act_dtype = DType::kF16;
  EXPECT_EQ(CacheStore::create(cfg, opt).status().message(),
            "CacheStore: act_dtype f16 on cpu: convolution tails are f32, or bf16 on a GPU");
  opt.act_dtype = DType::kBF16;
  EXPECT_EQ(CacheStore::create(cfg, opt).status().message(),
            "CacheStore: act_dtype bf16 on cpu: convolution tails are f32, or bf16 on a GPU");
  opt.act_dtype = DType::kI32;
  EXPECT_EQ(CacheStore::create(cfg, opt).status().message(),
            "CacheStore: act_dtype i32 is not a float type");
  opt.act_dtype = DType::kF32;
  opt.num_pages = -1;
  EXPECT_EQ(CacheStore::create(cfg, opt).status().code(), absl::StatusCode::kInvalidArgument);
#ifndef LOOM_WITH_CUDA
  opt.num_pages = 2;
  opt.device = Device::cuda(0);
  EXPECT_EQ(CacheStore::create(cfg, opt).status().message(),
            "CacheStore on cuda:0: this build has no CUDA backend");
#endif
}

void fill_random(const Tensor& t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// reset_slot, copy_slot and copy_page_rows change their slot or rows in every layer and nothing
// else (the per-slot reference: a copy of each pool edited by hand).
TEST(CacheStore, SlotAndPageOpsTouchOnlyTheirTargets) {
  auto m = Model::load(kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(m.ok());
  const ModelConfig& cfg = (*m)->config();
  std::mt19937 rng(11);
  CacheStore a(cfg, {.num_pages = 3, .page_size = 5, .num_slots = 4});
  CacheStore b(cfg, {.num_pages = 4, .page_size = 9, .num_slots = 3});
  std::vector<Tensor> all;
  for (const CacheStore* s : {&a, &b})
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (cfg.mixers[l] == MixerType::kMla) {
        all.push_back(s->pool(l, 0));
        all.push_back(s->pool(l, 1));
      } else {
        all.push_back(s->recurrent_states(l));
        all.push_back(s->conv_states(l));
      }
    }
  for (const Tensor& t : all) fill_random(t, rng);
  std::vector<std::vector<float>> want;
  for (const Tensor& t : all) want.push_back(values(t));
  const size_t per_store = all.size() / 2;
  // Item `i` of tensor `k` of the reference, as a span of floats.
  auto item = [&](size_t k, int64_t i, int64_t r0 = 0, int64_t r1 = -1) {
    const Tensor& t = all[k];
    const int64_t n = t.stride(0), row = t.ndim() > 1 ? t.stride(1) : n;
    if (r1 < 0) return std::span<float>(want[k].data() + i * n, n);
    return std::span<float>(want[k].data() + i * n + r0 * row, (r1 - r0) * row);
  };
  a.reset_slot(2);
  b.copy_slot(a, 3, 0);  // a's slot 3 into b's slot 0
  a.copy_slot(1, 3);     // within a: after the copy out of slot 3
  b.copy_page_rows(a, 2, 3, 1, 4);
  a.copy_page_rows(b, 1, 0, 0, 5);
  for (size_t k = 0; k < per_store; ++k) {
    const bool linear = all[k].dim(0) == 4;  // a's state pools have 4 slots, its pages 3
    if (!linear) {
      std::vector<float> src(item(per_store + k, 1, 0, 5).begin(),
                             item(per_store + k, 1, 0, 5).end());
      std::vector<float> from_a(item(k, 2, 1, 4).begin(), item(k, 2, 1, 4).end());
      std::copy(from_a.begin(), from_a.end(), item(per_store + k, 3, 1, 4).begin());
      std::copy(src.begin(), src.end(), item(k, 0, 0, 5).begin());
      continue;
    }
    std::fill(item(k, 2).begin(), item(k, 2).end(), 0.0f);
    std::copy(item(k, 3).begin(), item(k, 3).end(), item(per_store + k, 0).begin());
    std::copy(item(k, 1).begin(), item(k, 1).end(), item(k, 3).begin());
  }
  for (size_t k = 0; k < all.size(); ++k)
    EXPECT_EQ(values(all[k]), want[k]) << "pool " << k << " " << all[k].describe();
}

// Padded entries of a step's page table point at the scratch page, never at a live page.
TEST(CacheStore, PageTablePaddingIsTheScratchPage) {
  auto m = Model::load(kFixtures + "/kimi_linear_s0");
  ASSERT_TRUE(m.ok());
  const ModelConfig& cfg = (*m)->config();
  CacheStore store(cfg, {.num_pages = 8, .page_size = 64, .num_slots = 4});
  StepData step;
  std::mt19937 rng(5);
  const int32_t long_pages[] = {5, 7, 2}, short_pages[] = {3}, mid_pages[] = {6, 1};
  ForwardBatch b;
  b.store = &store;
  b.step = &step;
  b.token_ids = random_tokens(130 + 10 + 70, cfg.vocab_size, rng);
  b.seqs.push_back({.num_tokens = 130, .slot = 1, .pages = long_pages});
  b.seqs.push_back({.num_tokens = 10, .slot = 2, .pages = short_pages});
  b.seqs.push_back({.num_tokens = 70, .slot = 3, .pages = mid_pages});
  ASSERT_TRUE((*m)->forward(b).ok());
  ASSERT_EQ(step.page_table.shape(), Shape({3, 3}));
  const int32_t* t = step.page_table.data<int32_t>();
  const int32_t s = CacheStore::kScratchPage;
  EXPECT_EQ(std::vector<int32_t>(t, t + 9), (std::vector<int32_t>{5, 7, 2, 3, s, s, 6, 1, s}));
  EXPECT_EQ(s, 0);
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
    static const int32_t kPage0[] = {0};
    mixed.seqs[1] = {.num_tokens = n1, .slot = 0, .pages = kPage0};
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
