// Model::make_layout: validates a store-backed batch and packs its step data once.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/model/model.h"

namespace loom {

absl::StatusOr<BatchLayout> Model::make_layout(const ForwardBatch& batch, const Exec& ex,
                                               StepData& step) const {
  BatchLayout layout;
  layout.store = batch.store;
  bool needs_slots = false, needs_pages = false;
  for (MixerType m : cfg_.mixers) {
    needs_slots |= m == MixerType::kKda || m == MixerType::kGdn;
    needs_pages |= m == MixerType::kMla || m == MixerType::kGqa;
  }
  StepShape shape;
  shape.seqs = static_cast<int64_t>(batch.seqs.size());
  int64_t rows = 0;
  // Pages written this call (by any sequence) and slots used: no two sequences may share one.
  // Attention writes every sequence's rows before any sequence attends, so a page one sequence
  // reads may not be written by another either.
  absl::flat_hash_set<int32_t> written_pages, used_slots;
  // With fillers in the batch, the scratch slot and page are theirs: no real sequence may use them.
  if (std::any_of(batch.seqs.begin(), batch.seqs.end(),
                  [](const SequenceInput& in) { return in.padding; })) {
    used_slots.insert(CacheStore::kScratchSlot);
    written_pages.insert(CacheStore::kScratchPage);
  }
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    if (in.num_tokens <= 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no new tokens"));
    if (batch.store == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " has neither a cache nor a cache store"));
    if (in.start < 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " starts at ", in.start));
    const int64_t past = in.start;
    if (in.padding) {
      // Fillers share the scratch slot and page: they are checked to be exactly that.
      if (in.num_tokens != 1 || in.start != 0 ||
          (needs_slots && in.slot != CacheStore::kScratchSlot) ||
          (needs_pages && (in.pages.empty() || in.pages[0] != CacheStore::kScratchPage)))
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s,
            ": a padding row is one token at position 0 in the scratch slot and page"));
      shape.page_cols = std::max<int64_t>(shape.page_cols, needs_pages ? 1 : 0);
      rows += 1;
      layout.max_seqlen = std::max<int64_t>(layout.max_seqlen, 1);
      shape.logit_rows += in.logits == LogitsMode::kNone ? 0 : 1;
      continue;
    }
    if (needs_slots) {
      if (in.slot < 0 || in.slot >= batch.store->num_slots())
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": state slot ", in.slot,
                                                       " outside [0, ", batch.store->num_slots(),
                                                       ")"));
      if (!used_slots.insert(in.slot).second)
        return absl::InvalidArgumentError(
            absl::StrCat("state slot ", in.slot, " is used by two sequences"));
    }
    if (needs_pages) {
      const int64_t ps = batch.store->page_size();
      const int64_t need = (past + in.num_tokens + ps - 1) / ps;
      if (static_cast<int64_t>(in.pages.size()) < need)
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", in.pages.size(),
                                                       " pages cannot hold ", past + in.num_tokens,
                                                       " positions"));
      for (int64_t p = 0; p < need; ++p) {
        const int32_t id = in.pages[p];
        if (id < 0 || id >= batch.store->num_pages())
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", s, ": page ", id, " outside [0, ", batch.store->num_pages(), ")"));
        if (p >= past / ps && !written_pages.insert(id).second)
          return absl::InvalidArgumentError(
              absl::StrCat("page ", id, " is written by two sequences in one batch"));
      }
      shape.page_cols = std::max(shape.page_cols, need);
    }
    rows += in.num_tokens;
    layout.max_seqlen = std::max(layout.max_seqlen, in.num_tokens);
    shape.logit_rows += in.logits == LogitsMode::kAll    ? in.num_tokens
                        : in.logits == LogitsMode::kLast ? 1
                                                         : 0;
  }
  if (needs_pages) {
    shape.page_cols = std::max(shape.page_cols, batch.page_cols);
    const int64_t ps = batch.store->page_size();
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const SequenceInput& in = batch.seqs[s];
      if (in.padding) continue;
      for (int64_t p = 0; p < in.start / ps; ++p)
        if (written_pages.contains(in.pages[p]))
          return absl::InvalidArgumentError(absl::StrCat(
              "page ", in.pages[p], " is read by sequence ", s, " and written by another"));
    }
  }
  if (rows != static_cast<int64_t>(batch.token_ids.size()))
    return absl::InvalidArgumentError(absl::StrCat("sequence lengths sum to ", rows, " but ",
                                                   batch.token_ids.size(), " token ids given"));
  for (size_t i = 0; i < batch.token_ids.size(); ++i) {
    const int32_t id = batch.token_ids[i];
    if (id < 0 || id >= cfg_.vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", i,
                                                     " is outside [0, ", cfg_.vocab_size, ")"));
  }
  layout.num_rows = rows;

  // Valid: pack the step data once.
  shape.tokens = rows;
  step.begin(shape);
  int32_t* ids = step.token_ids.data<int32_t>();
  int64_t* positions = step.positions.data<int64_t>();
  int64_t* logit_rows = step.logit_rows.data<int64_t>();
  int64_t* cu = step.cu_seqlens.data<int64_t>();
  int32_t* table = step.page_table.data<int32_t>();
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), ids);
  int64_t r = 0, b = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceInput& in = batch.seqs[s];
    const int64_t n = in.num_tokens;
    cu[s] = b;
    step.past_lens.data<int64_t>()[s] = in.start;
    step.state_slots.data<int32_t>()[s] = in.slot;
    for (int64_t i = 0; i < n; ++i) positions[b + i] = in.start + i;
    if (in.logits == LogitsMode::kAll) {
      for (int64_t i = 0; i < n; ++i) logit_rows[r++] = b + i;
    } else if (in.logits == LogitsMode::kLast) {
      logit_rows[r++] = b + n - 1;
    }
    int32_t* row = table + static_cast<int64_t>(s) * shape.page_cols;
    const int64_t used = std::min<int64_t>(shape.page_cols, in.pages.size());
    std::copy(in.pages.begin(), in.pages.begin() + used, row);
    std::fill(row + used, row + shape.page_cols, CacheStore::kScratchPage);
    b += n;
  }
  cu[batch.seqs.size()] = rows;
  step.publish(ex);
  layout.token_ids = step.on_device(step.token_ids);
  layout.positions = step.on_device(step.positions);
  layout.logit_rows = step.on_device(step.logit_rows);
  layout.cu_seqlens = step.on_device(step.cu_seqlens);
  layout.past_lens = step.on_device(step.past_lens);
  layout.state_slots = step.on_device(step.state_slots);
  layout.page_table = step.on_device(step.page_table);
  // Views of the packed host block, not copies (a decode step allocates nothing): valid until
  // the step data's next begin(), and a layout serves the one forward that enqueues it right
  // after (Model::forward, the decode graphs' capture), which reads them while enqueueing.
  layout.host_cu_seqlens = step.cu_seqlens;
  layout.host_past_lens = step.past_lens;
  return layout;
}

}  // namespace loom
