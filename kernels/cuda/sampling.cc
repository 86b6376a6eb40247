// Host side of the batched GPU sampler: the checks, the packing of rows, edits, biases and row
// lists into one upload, and the one download of the results (kernels/cuda/sampling_launch.h).
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cuda/device.h"

namespace loom::cuda {
namespace {

using launch::SampleSortPath;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

SampleSortPath parse_path(const char* name) {
  for (SampleSortPath p : {SampleSortPath::kAuto, SampleSortPath::kSegmented,
                           SampleSortPath::kPerRow, SampleSortPath::kSelect}) {
    if (std::strcmp(name, launch::sample_sort_path_name(p)) == 0) return p;
  }
  LOOM_CHECK(false, "sample_logits: unknown sort path \"%s\" (auto, select, segmented, per_row)",
             name);
  return SampleSortPath::kAuto;
}

// Where everything lives in the scratch: the upload (rows, edits, biases, the three row lists,
// the segment offsets), the results, then the kernels' own scratch.
struct Packing {
  size_t rows = 0, edits = 0, biases = 0, greedy = 0, sampled = 0, with_logprobs = 0, offsets = 0,
         upload = 0, out = 0, work = 0, total = 0;
  launch::SampleArgs args;  // counts filled; pointers relative to the scratch's start
};

Packing pack_layout(const SampleBatch& b, int64_t vocab, SampleSortPath path) {
  Packing p;
  launch::SampleArgs& a = p.args;
  a.vocab = vocab;
  a.num_rows = static_cast<int>(b.rows.size());
  a.num_edits = static_cast<int>(b.edits.size());
  for (const launch::SampleRow& r : b.rows) {
    (r.temperature == 0.0f ? a.num_greedy : a.num_sampled)++;
    if (r.logprobs >= 0) {
      ++a.num_with_logprobs;
      a.max_top = std::max(a.max_top, r.logprobs);
    }
  }
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  p.rows = take(sizeof(launch::SampleRow) * b.rows.size());
  p.edits = take(sizeof(launch::SampleEdit) * b.edits.size());
  p.biases = take(sizeof(float) * b.biases.size());
  p.greedy = take(sizeof(int32_t) * a.num_greedy);
  p.sampled = take(sizeof(int32_t) * a.num_sampled);
  p.with_logprobs = take(sizeof(int32_t) * a.num_with_logprobs);
  p.offsets = take(sizeof(int32_t) * (launch::kSampleSortGroup + 1));
  p.upload = off;
  p.out = take(sizeof(launch::SampleOut) * b.rows.size());
  p.work = off;
  p.total = off + launch::sample_scratch_bytes(a, path);
  return p;
}

void check_batch(const SampleBatch& b, int64_t k, int64_t vocab) {
  static constexpr const char* kOp = "sample_logits";
  const int64_t num_edits = static_cast<int64_t>(b.edits.size());
  LOOM_CHECK(b.rows.size() <= INT_MAX && num_edits <= INT_MAX && b.biases.size() <= INT_MAX,
             "%s: %d rows, %d edits", kOp, b.rows.size(), num_edits);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const launch::SampleRow& r = b.rows[i];
    LOOM_CHECK(r.row >= 0 && r.row < k, "%s: rows[%d].row = %d, logits have %d rows", kOp, i, r.row,
               k);
    LOOM_CHECK(r.temperature >= 0.0f && std::isfinite(r.temperature) && r.top_k >= 0 &&
                   r.top_p > 0.0f && r.top_p <= 1.0f && r.min_p >= 0.0f && r.min_p <= 1.0f,
               "%s: rows[%d]: temperature %g top_k %d top_p %g min_p %g", kOp, i, r.temperature,
               r.top_k, r.top_p, r.min_p);
    LOOM_CHECK(r.logprobs >= -1 && r.logprobs <= launch::kSampleMaxLogprobs,
               "%s: rows[%d].logprobs = %d (-1 to %d)", kOp, i, r.logprobs,
               launch::kSampleMaxLogprobs);
    LOOM_CHECK(r.u >= 0.0 && r.u < 1.0, "%s: rows[%d].u = %g, expected [0, 1)", kOp, i, r.u);
    LOOM_CHECK(r.edit_begin >= 0 && r.edit_begin <= r.edit_end && r.edit_end <= num_edits,
               "%s: rows[%d] edits [%d, %d) of %d", kOp, i, r.edit_begin, r.edit_end, num_edits);
    ids.clear();
    for (int32_t e = r.edit_begin; e < r.edit_end; ++e) {
      const launch::SampleEdit& ed = b.edits[e];
      LOOM_CHECK(
          ed.row == r.row && ed.id >= 0 && ed.id < vocab && ed.bias_begin >= 0 &&
              ed.bias_begin <= ed.bias_end && ed.bias_end <= static_cast<int64_t>(b.biases.size()),
          "%s: edits[%d] (row %d id %d biases [%d, %d)) of rows[%d] (row %d, V %d, %d "
          "biases)",
          kOp, e, ed.row, ed.id, ed.bias_begin, ed.bias_end, i, r.row, vocab, b.biases.size());
      ids.push_back(ed.id);
    }
    std::sort(ids.begin(), ids.end());
    LOOM_CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end(),
               "%s: rows[%d] edits one token twice", kOp, i);
  }
}

}  // namespace

size_t sample_scratch_bytes(const SampleBatch& batch, int64_t vocab, const char* path) {
  return pack_layout(batch, vocab, parse_path(path)).total;
}

void sample_logits(const Exec& ex, const Tensor& logits, SampleBatch& batch, const Tensor& scratch,
                   std::vector<launch::SampleOut>& out, const char* path) {
  static constexpr const char* kOp = "sample_logits";
  LOOM_CHECK_CUDA_ARG(kOp, logits);
  LOOM_CHECK_CUDA_ARG(kOp, scratch);
  LOOM_CHECK_F32(logits);
  LOOM_CHECK(logits.ndim() == 2, "%s: logits %s, expected [k, V]", kOp, logits.describe().c_str());
  const int64_t k = logits.dim(0), vocab = logits.dim(1);
  LOOM_CHECK(vocab >= 1 && vocab <= launch::kSampleMaxVocab && k <= INT_MAX,
             "%s: logits %s (V from 1 to %d)", kOp, logits.describe().c_str(),
             launch::kSampleMaxVocab);
  LOOM_CHECK(scratch.device() == logits.device() && scratch.is_contiguous() &&
                 (reinterpret_cast<uintptr_t>(scratch.raw()) & 255u) == 0,
             "%s: scratch %s must be contiguous, 256-byte aligned and on the logits' device", kOp,
             scratch.describe().c_str());
  check_batch(batch, k, vocab);
  const SampleSortPath sort_path = parse_path(path);
  Packing p = pack_layout(batch, vocab, sort_path);
  LOOM_CHECK(scratch.nbytes() >= p.total, "%s: scratch %s holds %d bytes, %d needed", kOp,
             scratch.describe().c_str(), scratch.nbytes(), p.total);
  out.resize(batch.rows.size());
  if (batch.rows.empty()) return;

  // One upload: everything the kernels read, packed at its offsets.
  std::vector<unsigned char>& up = batch.staging;
  up.assign(p.upload, 0);
  auto put = [&](size_t at, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(up.data() + at, src, bytes);
  };
  put(p.rows, batch.rows.data(), sizeof(launch::SampleRow) * batch.rows.size());
  put(p.edits, batch.edits.data(), sizeof(launch::SampleEdit) * batch.edits.size());
  put(p.biases, batch.biases.data(), sizeof(float) * batch.biases.size());
  int32_t* greedy = reinterpret_cast<int32_t*>(up.data() + p.greedy);
  int32_t* sampled = reinterpret_cast<int32_t*>(up.data() + p.sampled);
  int32_t* with_logprobs = reinterpret_cast<int32_t*>(up.data() + p.with_logprobs);
  for (int32_t i = 0; i < static_cast<int32_t>(batch.rows.size()); ++i) {
    const launch::SampleRow& r = batch.rows[i];
    *(r.temperature == 0.0f ? greedy++ : sampled++) = i;
    if (r.logprobs >= 0) *with_logprobs++ = i;
  }
  int32_t* offsets = reinterpret_cast<int32_t*>(up.data() + p.offsets);
  for (int j = 0; j <= launch::kSampleSortGroup; ++j)
    offsets[j] = static_cast<int32_t>(j * vocab);  // kSampleSortGroup * kSampleMaxVocab < 2^31

  unsigned char* base = static_cast<unsigned char*>(scratch.raw());
  upload_async(ex, base, up.data(), p.upload);
  launch::SampleArgs& a = p.args;
  a.logits = logits.data<float>();
  a.rows_total = k;
  a.rows = reinterpret_cast<const launch::SampleRow*>(base + p.rows);
  a.edits = reinterpret_cast<const launch::SampleEdit*>(base + p.edits);
  a.biases = reinterpret_cast<const float*>(base + p.biases);
  a.greedy = reinterpret_cast<const int32_t*>(base + p.greedy);
  a.sampled = reinterpret_cast<const int32_t*>(base + p.sampled);
  a.with_logprobs = reinterpret_cast<const int32_t*>(base + p.with_logprobs);
  a.segment_offsets = reinterpret_cast<const int32_t*>(base + p.offsets);
  a.out = reinterpret_cast<launch::SampleOut*>(base + p.out);
  launch::sample(stream_of(ex), a, sort_path, base + p.work);
  download(ex, out.data(), a.out, sizeof(launch::SampleOut) * out.size());
}

}  // namespace loom::cuda
