// Raw launchers of the batched sampler (kernels/cuda/sampling.cu) and the plain structs its
// host side packs into one upload. Like launch.h this header includes no Loom or Abseil header,
// so nvcc never parses Abseil; the Tensor-level entry point and its checks are in
// kernels/cuda/sampling.{h,cc}.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda::launch {

inline constexpr int kSampleMaxLogprobs = 20;
// Sampled rows are sorted (and their scratch sized) this many at a time.
inline constexpr int kSampleSortGroup = 64;
// Rows longer than this are refused (the inverse-CDF kernels keep one double per 2048 sorted
// entries in shared memory).
inline constexpr int64_t kSampleMaxVocab = int64_t{1024} * 2048;

// One row to sample: the sampler's parameters, already validated (engine/sampling).
struct SampleRow {
  int32_t row = 0;           // logits row
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0 or >= V: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  int32_t logprobs = -1;     // -1: none; 0..kSampleMaxLogprobs: the chosen one and the top n
  double u = 0.0;            // the row's uniform draw in [0, 1) (unused when greedy)
  int32_t edit_begin = 0;    // [edit_begin, edit_end) in the edits: this row's changed logits
  int32_t edit_end = 0;
};

// What one token's logit goes through before sampling, in this order: biases[bias_begin,
// bias_end) added one by one, the repetition penalty, the presence/frequency penalty subtracted,
// then -inf. At most one edit per (row, id).
inline constexpr int32_t kEditRepetition = 1;
inline constexpr int32_t kEditPenalty = 2;
inline constexpr int32_t kEditMask = 4;
struct SampleEdit {
  int32_t row = 0;  // logits row (the owning SampleRow's)
  int32_t id = 0;
  int32_t flags = 0;
  int32_t bias_begin = 0;
  int32_t bias_end = 0;
  float repetition = 1.0f;  // positive logits divided by it, others multiplied
  float penalty = 0.0f;     // presence + frequency * count, subtracted
};

// One sampled row's result (downloaded as is).
struct SampleOut {
  int32_t token = -1;
  float logprob = 0.0f;    // log-softmax of the raw logits at `token` (rows with logprobs >= 0)
  int32_t num_top = 0;     // min(logprobs, V)
  int32_t sorted_all = 0;  // sampled rows: 1 when the row took the full sort (SampleSortPath)
  int32_t top_ids[kSampleMaxLogprobs] = {};  // raw top ids, descending, ties by id
  float top_logprobs[kSampleMaxLogprobs] = {};
};

// How sampled rows are sorted: one CUB segmented radix sort over the group's rows (one block per
// row), one CUB radix sort per row (every SM on one row), or kSelect: only each row's top
// entries (a radix select), with the segmented sort for the rows whose cut or pick falls past
// them (kernels/cuda/sampling.cu). kAuto is kSelect; the two full sorts stay selectable as its
// reference (tests/gpu/model_sampling_cuda_test.cc) and for the benchmark.
enum class SampleSortPath : int { kAuto = 0, kSegmented = 1, kPerRow = 2, kSelect = 3 };
const char* sample_sort_path_name(SampleSortPath path);

struct SampleArgs {
  float* logits = nullptr;  // [rows_total, vocab]; the edits are applied in place
  int64_t rows_total = 0;
  int64_t vocab = 0;
  const SampleRow* rows = nullptr;  // [num_rows], device
  int num_rows = 0;
  const SampleEdit* edits = nullptr;  // [num_edits], device
  int num_edits = 0;
  const float* biases = nullptr;  // device
  // Indices into rows, device: greedy rows, sampled rows, rows that want logprobs.
  const int32_t* greedy = nullptr;
  int num_greedy = 0;
  const int32_t* sampled = nullptr;
  int num_sampled = 0;
  const int32_t* with_logprobs = nullptr;
  int num_with_logprobs = 0;
  int max_top = 0;  // the largest logprobs over those rows
  // [kSampleSortGroup + 1] device ints j * vocab (the segmented sort's offsets).
  const int32_t* segment_offsets = nullptr;
  SampleOut* out = nullptr;  // [num_rows], device
};

// Device scratch bytes sample() needs for `a` (pointers unused) on `path`.
size_t sample_scratch_bytes(const SampleArgs& a, SampleSortPath path);
// Enqueues the whole batch; `scratch` holds sample_scratch_bytes bytes, 256-byte aligned.
void sample(cudaStream_t stream, const SampleArgs& a, SampleSortPath path, void* scratch);

}  // namespace loom::cuda::launch
