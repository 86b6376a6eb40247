// The batched sampler on the GPU: per-row logit edits (bias, penalties, min_tokens masks),
// greedy argmax or temperature sampling with top-k, top-p and min-p by inverse CDF over a
// uniform draw the caller supplies, and raw logprobs, for many rows of one logits tensor in one
// upload and one download. The arithmetic is engine/sampling/sampler.cc's
// (SamplerState::sample), which engine/sampling/batch_sampler.cc packs for it: the same logits
// and the same draw give the same token (kernels/cuda/sampling.cu says how, and where the two
// may differ: a draw within ~1e-16 of a boundary).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/sampling_launch.h"
#include "kernels/exec.h"

namespace loom::cuda {

// A step's sampling work, described on the host. The caller fills rows, edits and biases (the
// formats are in kernels/cuda/sampling_launch.h); `staging` is sample_logits' upload buffer,
// kept here so that a warm step reuses its capacity.
struct SampleBatch {
  std::vector<launch::SampleRow> rows;
  std::vector<launch::SampleEdit> edits;
  std::vector<float> biases;
  std::vector<unsigned char> staging;

  void clear() {
    rows.clear();
    edits.clear();
    biases.clear();
  }
};

// Device bytes sample_logits needs for `batch` over logits rows of `vocab` entries on `path`
// ("auto", "select", "segmented" or "per_row": launch::SampleSortPath).
size_t sample_scratch_bytes(const SampleBatch& batch, int64_t vocab, const char* path = "auto");

// Samples every row of `batch` from `logits` [k, V] (contiguous f32 on the GPU), which it
// modifies (the edits are applied in place): one upload of the batch, the kernels, then one
// download of the results into `out` (resized to batch.rows.size(), in row order), which waits
// for them. The select path (the default) also waits once per kSampleSortGroup sampled rows, for
// a small download of which rows need a full sort. `scratch`: device memory on the logits' device
// of at least sample_scratch_bytes bytes (contents ignored); nothing is allocated on the device.
// Aborts naming the field when a row or edit is out of range (the engine validates requests first:
// SamplingParams::validate).
void sample_logits(const Exec& ex, const Tensor& logits, SampleBatch& batch, const Tensor& scratch,
                   std::vector<launch::SampleOut>& out, const char* path = "auto");

}  // namespace loom::cuda
