#include "engine/sampling/batch_sampler.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "core/allocator.h"
#include "core/status.h"
#include "kernels/exec.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/sampling.h"
#endif

namespace loom {

#ifdef LOOM_WITH_CUDA

// The GPU path: SamplerState::sample's edits (logit bias, penalties, min_tokens masks) packed per
// row as one edit per touched token, in the order sample() applies them, plus the row's draw.
struct BatchSampler::Gpu {
  cuda::SampleBatch batch;
  std::vector<cuda::launch::SampleOut> out;
  std::vector<int32_t> row_slot;                  // batch row -> slot
  absl::flat_hash_map<int32_t, int32_t> edit_of;  // token -> edit index, for the current row
  std::shared_ptr<void> scratch;
  size_t scratch_bytes = 0;

  cuda::launch::SampleEdit& edit(int32_t row, int32_t id) {
    auto [it, fresh] = edit_of.try_emplace(id, static_cast<int32_t>(batch.edits.size()));
    if (fresh) batch.edits.push_back({.row = row, .id = id});
    return batch.edits[it->second];
  }

  void add_row(int32_t row, const SampleSlot& slot) {
    const SamplingParams& p = *slot.params;
    SamplerState& st = *slot.state;
    cuda::launch::SampleRow r;
    r.row = row;
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    r.logprobs = p.logprobs;
    r.u = st.next_uniform();  // sample() draws once per token, greedy or not
    r.edit_begin = static_cast<int32_t>(batch.edits.size());
    edit_of.clear();
    // Logit biases, each token's in list order: first count them, then lay them out.
    if (!p.logit_bias.empty()) {
      for (const auto& [t, b] : p.logit_bias) ++edit(row, t).bias_end;
      int32_t at = static_cast<int32_t>(batch.biases.size());
      for (size_t e = r.edit_begin; e < batch.edits.size(); ++e) {
        cuda::launch::SampleEdit& ed = batch.edits[e];
        ed.bias_begin = at;
        at += ed.bias_end;
        ed.bias_end = ed.bias_begin;
      }
      batch.biases.resize(at);
      for (const auto& [t, b] : p.logit_bias) batch.biases[edit(row, t).bias_end++] = b;
    }
    if (p.repetition_penalty != 1.0f) {
      auto penalise = [&](int32_t t) {
        cuda::launch::SampleEdit& ed = edit(row, t);
        ed.flags |= cuda::launch::kEditRepetition;
        ed.repetition = p.repetition_penalty;
      };
      for (const auto& [t, _] : st.prompt_tokens()) penalise(t);
      for (const auto& [t, _] : st.output_counts()) penalise(t);
    }
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
      for (const auto& [t, count] : st.output_counts()) {
        cuda::launch::SampleEdit& ed = edit(row, t);
        ed.flags |= cuda::launch::kEditPenalty;
        ed.penalty = presence_frequency_penalty(p, count);
      }
    }
    if (st.num_generated() < p.min_tokens) {
      for (int32_t t : slot.eos_ids) edit(row, t).flags |= cuda::launch::kEditMask;
      for (int32_t t : p.stop_token_ids) edit(row, t).flags |= cuda::launch::kEditMask;
    }
    r.edit_end = static_cast<int32_t>(batch.edits.size());
    batch.rows.push_back(r);
  }

  void grow(size_t bytes, Device device) {
    if (bytes > scratch_bytes) {  // a larger step than any before: grow once
      scratch.reset();            // give the old block back before taking the larger one
      scratch = allocate_buffer(bytes, device);
      scratch_bytes = bytes;
    }
  }

  void run(const Tensor& logits, bool poison) {
    grow(cuda::sample_scratch_bytes(batch, logits.dim(1)), logits.device());
    if (poison) {
      const std::vector<unsigned char> ff(scratch_bytes, 0xff);
      upload_async(exec_for(logits.device()), scratch.get(), ff.data(), ff.size());
    }
    const Tensor s = Tensor::wrap(scratch.get(), {static_cast<int64_t>(scratch_bytes)}, DType::kU8,
                                  logits.device(), scratch);
    cuda::sample_logits(exec_for(logits.device()), logits, batch, s, out);
  }
};

#else

struct BatchSampler::Gpu {};

#endif

BatchSampler::BatchSampler(Device device) : device_(device) {
#ifdef LOOM_WITH_CUDA
  if (!device.is_cpu()) gpu_ = std::make_unique<Gpu>();
#else
  LOOM_CHECK(device.is_cpu(), "BatchSampler on %s in a build without CUDA",
             device_name(device).c_str());
#endif
}

BatchSampler::~BatchSampler() = default;

size_t BatchSampler::reserve(int32_t max_rows, int64_t vocab) {
#ifdef LOOM_WITH_CUDA
  if (gpu_ == nullptr || max_rows <= 0) return 0;
  cuda::SampleBatch worst;
  for (int32_t r = 0; r < max_rows; ++r)
    worst.rows.push_back({.row = r,
                          .temperature = 1.0f,
                          .top_p = 0.5f,
                          .logprobs = cuda::launch::kSampleMaxLogprobs});
  size_t bytes = 0;
  for (const char* path : {"auto", "segmented", "per_row"})
    bytes = std::max(bytes, cuda::sample_scratch_bytes(worst, vocab, path));
  gpu_->grow(bytes, device_);
  return gpu_->scratch_bytes;
#else
  (void)max_rows;
  (void)vocab;
  return 0;
#endif
}

const std::vector<SampledToken>& BatchSampler::sample(const Tensor& logits,
                                                      std::span<const SampleSlot> slots) {
  out_.assign(slots.size(), SampledToken{});
  if (slots.empty()) return out_;
  LOOM_CHECK(logits.device() == device_ && logits.dtype() == DType::kF32 &&
                 logits.is_contiguous() && logits.ndim() == 2 &&
                 logits.dim(0) == static_cast<int64_t>(slots.size()),
             "BatchSampler on %s: logits %s for %d rows", device_name(device_).c_str(),
             logits.describe().c_str(), slots.size());
  const int64_t vocab = logits.dim(1);
  if (device_.is_cpu()) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const SampleSlot& s = slots[i];
      if (s.state == nullptr) continue;
      std::span<float> row(logits.data<float>() + static_cast<int64_t>(i) * vocab, vocab);
      out_[i] = s.state->sample(row, *s.params, s.eos_ids);
    }
    return out_;
  }
#ifdef LOOM_WITH_CUDA
  Gpu& g = *gpu_;
  g.batch.clear();
  g.row_slot.clear();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].state == nullptr) continue;
    g.add_row(static_cast<int32_t>(i), slots[i]);
    g.row_slot.push_back(static_cast<int32_t>(i));
  }
  if (g.batch.rows.empty()) return out_;
  g.run(logits, poison_);
  for (size_t r = 0; r < g.row_slot.size(); ++r) {
    const int32_t i = g.row_slot[r];
    const cuda::launch::SampleOut& o = g.out[r];
    SampledToken& tok = out_[i];
    tok.token = o.token;
    if (slots[i].params->logprobs >= 0) {
      tok.logprob = o.logprob;
      for (int32_t t = 0; t < o.num_top; ++t)
        tok.top_logprobs.emplace_back(o.top_ids[t], o.top_logprobs[t]);
    }
    slots[i].state->record(tok.token);
  }
#endif
  return out_;
}

}  // namespace loom
