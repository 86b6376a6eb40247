// The synthetic tasks (trainer/synthetic_tasks.h) produce what they claim: every scored position
// of an MQAR example asks for the value its key had earlier, and a passkey example hides the key
// at the requested depth and scores exactly the key's digits.
#include "trainer/synthetic_tasks.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(Mqar, TrainingDropsThePaddingAndCanScoreEveryToken) {
  std::mt19937_64 rng(5);
  MqarOptions o;
  o.num_pairs = 5;
  o.seq_len = 64;
  Example ex = make_mqar(o, rng);
  const Example whole = ex;
  drop_unscored_tail(ex);
  ASSERT_EQ(ex.tokens.size(), 20u);  // 5 pairs, then 5 keys each followed by its value
  EXPECT_EQ(ex.loss_mask.size(), 20u);
  EXPECT_EQ(ex.scored(), 5);
  for (size_t i = 0; i < ex.tokens.size(); ++i) {
    EXPECT_EQ(ex.tokens[i], whole.tokens[i]) << i;
    EXPECT_EQ(ex.loss_mask[i], whole.loss_mask[i]) << i;
  }
  for (size_t i = ex.tokens.size(); i < whole.tokens.size(); ++i)
    EXPECT_EQ(whole.tokens[i], o.pad_id) << i;  // only padding went
  score_all_tokens(ex);
  EXPECT_EQ(ex.scored(), 19);
  EXPECT_EQ(ex.loss_mask.back(), 0);
  Example none{{1, 2, 3}, {0, 0, 0}};
  drop_unscored_tail(none);
  EXPECT_EQ(none.tokens.size(), 3u);  // nothing scored: left alone
}

TEST(Mqar, EveryScoredPositionRecallsItsKeysValue) {
  std::mt19937_64 rng(3);
  MqarOptions o;
  o.num_pairs = 16;
  o.seq_len = 256;
  ASSERT_TRUE(o.validate().ok());
  for (int n = 0; n < 20; ++n) {
    const Example ex = make_mqar(o, rng);
    ASSERT_EQ(ex.tokens.size(), 256u);
    ASSERT_EQ(ex.loss_mask.size(), 256u);
    EXPECT_EQ(ex.scored(), 16);
    std::map<int32_t, int32_t> value_of;
    for (int i = 0; i < 2 * o.num_pairs; i += 2) {
      const int32_t k = ex.tokens[i], v = ex.tokens[i + 1];
      EXPECT_TRUE(k >= o.key_begin && k < o.key_begin + o.num_keys);
      EXPECT_TRUE(v >= o.value_begin && v < o.value_begin + o.num_values);
      EXPECT_TRUE(value_of.emplace(k, v).second) << "key " << k << " repeated";
    }
    for (size_t i = 0; i + 1 < ex.tokens.size(); ++i) {
      if (!ex.loss_mask[i]) continue;
      ASSERT_TRUE(value_of.contains(ex.tokens[i])) << i;
      EXPECT_EQ(ex.tokens[i + 1], value_of[ex.tokens[i]]) << i;
      EXPECT_GE(i, 2u * o.num_pairs);
    }
    EXPECT_EQ(ex.loss_mask.back(), 0);
  }
}

// Spread queries: the pairs first, then two-token slots over the rest of the sequence, each a
// query (its key, then the key's value) or padding; every key is queried once, and over many
// examples the queries reach the far end.
TEST(Mqar, SpreadQueriesFillSlotsOverTheWholeSequence) {
  std::mt19937_64 rng(11);
  MqarOptions o;
  o.num_pairs = 16;
  o.seq_len = 256;
  o.spread = true;
  ASSERT_TRUE(o.validate().ok());
  size_t last_query = 0;
  for (int n = 0; n < 50; ++n) {
    const Example ex = make_mqar(o, rng);
    ASSERT_EQ(ex.tokens.size(), 256u);
    EXPECT_EQ(ex.scored(), 16);
    std::map<int32_t, int32_t> value_of;
    for (int i = 0; i < 2 * o.num_pairs; i += 2) value_of[ex.tokens[i]] = ex.tokens[i + 1];
    ASSERT_EQ(value_of.size(), 16u);
    std::map<int32_t, int> queried;
    for (size_t i = 2 * o.num_pairs; i < ex.tokens.size(); i += 2) {
      if (ex.loss_mask[i]) {
        ASSERT_TRUE(value_of.contains(ex.tokens[i])) << i;
        EXPECT_EQ(ex.tokens[i + 1], value_of[ex.tokens[i]]) << i;
        EXPECT_EQ(ex.loss_mask[i + 1], 0) << i;
        ++queried[ex.tokens[i]];
        last_query = std::max(last_query, i);
      } else {
        EXPECT_EQ(ex.tokens[i], o.pad_id) << i;
        EXPECT_EQ(ex.tokens[i + 1], o.pad_id) << i;
      }
    }
    EXPECT_EQ(queried.size(), 16u);
    for (const auto& [key, times] : queried) EXPECT_EQ(times, 1) << key;
  }
  EXPECT_GT(last_query, 200u);  // the packed layout ends its queries at position 62
  // Without spread the same options keep the packed layout.
  o.spread = false;
  const Example packed = make_mqar(o, rng);
  for (int i = 2 * o.num_pairs; i < 4 * o.num_pairs; i += 2) EXPECT_EQ(packed.loss_mask[i], 1) << i;
}

// min_pairs: each example has between min_pairs and num_pairs pairs (every count turns up over
// many draws), queried once each, spread over the same length.
TEST(Mqar, MinPairsDrawsEachExamplesPairCount) {
  std::mt19937_64 rng(5);
  MqarOptions o;
  o.num_pairs = 8;
  o.min_pairs = 3;
  o.seq_len = 64;
  o.spread = true;
  ASSERT_TRUE(o.validate().ok());
  std::set<int64_t> counts;
  for (int n = 0; n < 200; ++n) {
    const Example ex = make_mqar(o, rng);
    ASSERT_EQ(ex.tokens.size(), 64u);
    const int64_t pairs = ex.scored();
    counts.insert(pairs);
    std::map<int32_t, int32_t> value_of;
    for (int i = 0; i < 2 * pairs; i += 2) value_of[ex.tokens[i]] = ex.tokens[i + 1];
    ASSERT_EQ(static_cast<int64_t>(value_of.size()), pairs);
    for (size_t i = 2 * pairs; i + 1 < ex.tokens.size(); ++i) {
      if (!ex.loss_mask[i]) continue;
      ASSERT_TRUE(value_of.contains(ex.tokens[i])) << i;
      EXPECT_EQ(ex.tokens[i + 1], value_of[ex.tokens[i]]) << i;
    }
  }
  EXPECT_EQ(counts, (std::set<int64_t>{3, 4, 5, 6, 7, 8}));
  // min_pairs = num_pairs draws nothing: the examples of min_pairs 0, token for token.
  std::mt19937_64 r1(9), r2(9);
  MqarOptions fixed = o;
  fixed.min_pairs = 0;
  o.min_pairs = o.num_pairs;
  for (int n = 0; n < 5; ++n) EXPECT_EQ(make_mqar(o, r1).tokens, make_mqar(fixed, r2).tokens);
  o.min_pairs = 9;
  EXPECT_NE(o.validate().message().find("min_pairs"), std::string::npos);
  o.min_pairs = -1;
  EXPECT_NE(o.validate().message().find("min_pairs"), std::string::npos);
}

TEST(Mqar, RejectsLayoutsThatCannotWork) {
  MqarOptions o;
  o.num_pairs = 100;
  o.seq_len = 256;
  EXPECT_NE(o.validate().message().find("pairs"), std::string::npos);
  o = {};
  o.value_begin = 100;  // overlaps the keys [1, 129)
  EXPECT_NE(o.validate().message().find("disjoint"), std::string::npos);
  o = {};
  o.num_keys = 8;
  EXPECT_NE(o.validate().message().find("keys"), std::string::npos);
}

TEST(Passkey, HidesTheKeyAtTheDepthAndScoresItsDigits) {
  const auto tok = Tokenizer::byte_level();
  for (double depth : {0.0, 0.3, 1.0}) {
    std::mt19937_64 rng(7);
    std::string key;
    auto ex = make_passkey(*tok, {.context_tokens = 2000, .depth = depth, .digits = 5}, rng, &key);
    ASSERT_TRUE(ex.ok()) << ex.status();
    ASSERT_EQ(key.size(), 5u);
    // The scored predictions are exactly " " + key (byte-level: one token per byte).
    std::string answer;
    for (size_t i = 0; i + 1 < ex->tokens.size(); ++i)
      if (ex->loss_mask[i]) answer.push_back(static_cast<char>(ex->tokens[i + 1]));
    EXPECT_EQ(answer, " " + key);
    auto text = tok->decode(ex->tokens);
    ASSERT_TRUE(text.ok());
    EXPECT_NEAR(static_cast<double>(ex->tokens.size()), 2000, 80);
    const size_t needle = text->find("The pass key is " + key);
    ASSERT_NE(needle, std::string::npos);
    const size_t question = text->find("What is the pass key?");
    // Relative position of the needle in the filler, within one filler sentence (~75 bytes).
    EXPECT_NEAR(static_cast<double>(needle) / question, depth, 0.06) << depth;
  }
}

TEST(Passkey, RejectsImpossibleRequests) {
  const auto tok = Tokenizer::byte_level();
  std::mt19937_64 rng(1);
  EXPECT_FALSE(make_passkey(*tok, {.context_tokens = 1000, .depth = 1.5}, rng).ok());
  EXPECT_FALSE(make_passkey(*tok, {.context_tokens = 1000, .digits = 0}, rng).ok());
  EXPECT_NE(make_passkey(*tok, {.context_tokens = 50}, rng).status().message().find("shorter"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
