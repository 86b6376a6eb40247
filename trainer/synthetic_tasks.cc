#include "trainer/synthetic_tasks.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {

int64_t Example::scored() const {
  return std::count(loss_mask.begin(), loss_mask.end(), uint8_t{1});
}

void drop_unscored_tail(Example& ex) {
  const auto last = std::find(ex.loss_mask.rbegin(), ex.loss_mask.rend(), uint8_t{1});
  if (last == ex.loss_mask.rend()) return;
  // Position i scores tokens[i + 1]: keep through the last scored position's target.
  const size_t keep = static_cast<size_t>(ex.loss_mask.rend() - last) + 1;
  ex.tokens.resize(keep);
  ex.loss_mask.resize(keep);
  ex.loss_mask.back() = 0;
}

void score_all_tokens(Example& ex) {
  std::fill(ex.loss_mask.begin(), ex.loss_mask.end(), uint8_t{1});
  if (!ex.loss_mask.empty()) ex.loss_mask.back() = 0;
}

absl::Status MqarOptions::validate() const {
  if (num_pairs < 1 || 4LL * num_pairs > seq_len)
    return absl::InvalidArgumentError(absl::StrCat(
        "mqar: ", num_pairs, " pairs need ", 4LL * num_pairs, " tokens; seq_len is ", seq_len));
  if (min_pairs < 0 || min_pairs > num_pairs)
    return absl::InvalidArgumentError(
        absl::StrCat("mqar: min_pairs ", min_pairs, " outside [0, num_pairs = ", num_pairs, "]"));
  if (num_keys < num_pairs || num_values < 1)
    return absl::InvalidArgumentError(absl::StrCat("mqar: ", num_keys, " keys and ", num_values,
                                                   " values for ", num_pairs, " pairs"));
  const bool overlap = key_begin < value_begin + num_values && value_begin < key_begin + num_keys;
  auto in = [](int32_t id, int32_t begin, int32_t n) { return id >= begin && id < begin + n; };
  if (key_begin < 0 || value_begin < 0 || overlap || in(pad_id, key_begin, num_keys) ||
      in(pad_id, value_begin, num_values))
    return absl::InvalidArgumentError(
        "mqar: key, value and pad ids must be non-negative and disjoint");
  return absl::OkStatus();
}

Example make_mqar(const MqarOptions& o, std::mt19937_64& rng) {
  const int num_pairs = o.min_pairs > 0 && o.min_pairs < o.num_pairs
                            ? std::uniform_int_distribution<int>(o.min_pairs, o.num_pairs)(rng)
                            : o.num_pairs;
  std::vector<int32_t> keys(o.num_keys);
  std::iota(keys.begin(), keys.end(), o.key_begin);
  std::shuffle(keys.begin(), keys.end(), rng);
  keys.resize(num_pairs);
  std::uniform_int_distribution<int32_t> value(o.value_begin, o.value_begin + o.num_values - 1);
  std::vector<int32_t> values(num_pairs);
  for (int32_t& v : values) v = value(rng);
  Example ex;
  ex.tokens.reserve(o.seq_len);
  for (int i = 0; i < num_pairs; ++i) {
    ex.tokens.push_back(keys[i]);
    ex.tokens.push_back(values[i]);
  }
  ex.loss_mask.assign(ex.tokens.size(), 0);
  std::vector<int> order(num_pairs);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const auto query = [&](int i) {
    ex.tokens.push_back(keys[i]);
    ex.loss_mask.push_back(1);  // from the key, predict its value
    ex.tokens.push_back(values[i]);
    ex.loss_mask.push_back(0);
  };
  if (!o.spread) {
    for (int i : order) query(i);
  } else {
    const int slots = (o.seq_len - 2 * num_pairs) / 2;
    std::vector<int> chosen(slots);
    std::iota(chosen.begin(), chosen.end(), 0);
    std::shuffle(chosen.begin(), chosen.end(), rng);
    chosen.resize(num_pairs);
    std::sort(chosen.begin(), chosen.end());
    for (int s = 0, next = 0; s < slots; ++s) {
      if (next < num_pairs && chosen[next] == s) {
        query(order[next++]);
      } else {
        ex.tokens.insert(ex.tokens.end(), {o.pad_id, o.pad_id});
        ex.loss_mask.insert(ex.loss_mask.end(), {0, 0});
      }
    }
  }
  while (static_cast<int>(ex.tokens.size()) < o.seq_len) {
    ex.tokens.push_back(o.pad_id);
    ex.loss_mask.push_back(0);
  }
  return ex;
}

absl::StatusOr<Example> make_passkey(const Tokenizer& tok, const PasskeyOptions& o,
                                     std::mt19937_64& rng, std::string* passkey) {
  if (!(o.depth >= 0.0 && o.depth <= 1.0))
    return absl::InvalidArgumentError(absl::StrCat("passkey: depth ", o.depth, " outside [0, 1]"));
  if (o.digits < 1 || o.digits > 9)
    return absl::InvalidArgumentError(absl::StrCat("passkey: ", o.digits, " digits (1 to 9)"));
  std::uniform_int_distribution<int> digit(0, 9);
  std::string key;
  for (int i = 0; i < o.digits; ++i) key.push_back(static_cast<char>('0' + digit(rng)));
  if (passkey) *passkey = key;

  const std::vector<int32_t> intro =
      tok.encode("There is a pass key hidden in this text. Find it and remember it.", false);
  const std::vector<int32_t> filler = tok.encode(
      " The grass is green. The sky is blue. The sun is yellow. Here we go again.", false);
  const std::vector<int32_t> needle = tok.encode(
      absl::StrCat(" The pass key is ", key, ". Remember it. ", key, " is the pass key."), false);
  const std::vector<int32_t> question = tok.encode(" What is the pass key? The pass key is", false);
  const std::vector<int32_t> answer = tok.encode(absl::StrCat(" ", key), false);
  const int64_t fixed = static_cast<int64_t>(intro.size() + needle.size() + question.size());
  if (o.context_tokens < fixed + static_cast<int64_t>(filler.size()))
    return absl::InvalidArgumentError(absl::StrCat("passkey: context of ", o.context_tokens,
                                                   " tokens is shorter than the task's ",
                                                   fixed + filler.size(), " fixed tokens"));
  const int64_t repeats = (o.context_tokens - fixed) / static_cast<int64_t>(filler.size());
  const int64_t before = static_cast<int64_t>(o.depth * static_cast<double>(repeats) + 0.5);
  Example ex;
  ex.tokens = intro;
  for (int64_t r = 0; r < repeats; ++r) {
    if (r == before) ex.tokens.insert(ex.tokens.end(), needle.begin(), needle.end());
    ex.tokens.insert(ex.tokens.end(), filler.begin(), filler.end());
  }
  if (before >= repeats) ex.tokens.insert(ex.tokens.end(), needle.begin(), needle.end());
  ex.tokens.insert(ex.tokens.end(), question.begin(), question.end());
  ex.loss_mask.assign(ex.tokens.size(), 0);
  ex.loss_mask.back() = 1;  // the question's last token predicts the answer's first
  for (size_t i = 0; i < answer.size(); ++i) {
    ex.tokens.push_back(answer[i]);
    ex.loss_mask.push_back(i + 1 < answer.size() ? 1 : 0);
  }
  return ex;
}

absl::Status PasskeyTrainOptions::validate(int64_t seq_len) const {
  if (digits < 1 || digits > 9)
    return absl::InvalidArgumentError(absl::StrCat("passkey: ", digits, " digits (1 to 9)"));
  if (min_context < 1 || min_context > max_context(seq_len))
    return absl::InvalidArgumentError(
        absl::StrCat("passkey: min_context ", min_context, " is outside [1, ", max_context(seq_len),
                     "] (seq_len ", seq_len, " less the answer's ", digits + 1, " tokens)"));
  return absl::OkStatus();
}

absl::StatusOr<Example> draw_passkey(const Tokenizer& tok, const PasskeyTrainOptions& o,
                                     int64_t seq_len, std::mt19937_64& rng) {
  LOOM_RETURN_IF_ERROR(o.validate(seq_len));
  std::uniform_int_distribution<int64_t> context(o.min_context, o.max_context(seq_len));
  std::uniform_real_distribution<double> depth(0.0, 1.0);
  PasskeyOptions p;
  p.context_tokens = context(rng);
  p.depth = depth(rng);
  p.digits = o.digits;
  return make_passkey(tok, p, rng);
}

}  // namespace loom
