// The building blocks of a decoder layer: token mixers (KDA, MLA, ...) and FFNs (dense, MoE).
// Each is built from ModelConfig plus the checkpoint (through WeightLoader's canonical names) and
// runs on a whole varlen batch: token-parallel work (projections, norms, FFNs) over all rows at
// once, sequence-ordered work (convolution, recurrence, attention) per sequence with its cache in
// the step's CacheStore.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "engine/model/cache_store.h"
#include "kernels/attention.h"
#include "kernels/exec.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

// Where each sequence's rows sit in the flattened batch, and where its caches live: a state slot
// and a page-table row of `store` (private caches are staged into a store too: Model::forward).
// The tensors are views of the step's StepData (what kernels read); the vectors are host copies of
// the per-sequence bounds for the loops that still run per sequence on the host.
struct BatchLayout {
  std::vector<int64_t> start;   // first row of sequence i
  std::vector<int64_t> length;  // its number of new tokens
  std::vector<int64_t> past;    // positions it already had cached
  std::vector<int32_t> slots;   // its linear-attention state slot
  Tensor positions;             // i64 [N] absolute position of every row
  Tensor logit_rows;            // i64 [R] rows whose logits are computed
  Tensor page_table;            // i32 [B, P]
  int64_t num_rows = 0;
  CacheStore* store = nullptr;  // never null in a forward

  // Layer `layer`'s attention cache of sequence i, visible positions [0, past + length).
  // which: MLA 0 latent / 1 rope; GQA 0 key / 1 value.
  CacheView attention(size_t i, int layer, int which) const;
  // Layer `layer`'s linear-attention state of sequence i.
  Tensor recurrent(size_t i, int layer) const { return store->recurrent(layer, slots[i]); }
  Tensor conv(size_t i, int layer) const { return store->conv(layer, slots[i]); }
};

// What every layer's forward receives for one step: where it runs (device, stream, numerics)
// with the step's workspace, and the step's sequences and caches. Layers take every
// intermediate from the workspace inside a Workspace::Mark, so a layer reuses the memory of the
// layer before and the step allocates nothing once the workspace is sized.
struct ForwardContext {
  Exec ex;  // ex.workspace is never null here
  const BatchLayout& batch;

  Workspace& ws() const { return *ex.workspace; }
  Tensor take(Shape shape, DType dtype = DType::kF32) const {
    return ex.workspace->take(shape, dtype);
  }
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  // x: [N, D] normalised input; out: [N, D] (overwritten). `layer` indexes the caches.
  virtual void forward(const ForwardContext& ctx, const Tensor& x, int layer,
                       const Tensor& out) const = 0;
};

class Ffn {
 public:
  virtual ~Ffn() = default;
  // x: [N, D]; out: [N, D] (overwritten).
  virtual void forward(const ForwardContext& ctx, const Tensor& x, const Tensor& out) const = 0;
};

absl::StatusOr<std::unique_ptr<Mixer>> make_kda_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer);
absl::StatusOr<std::unique_ptr<Mixer>> make_mla_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer);
absl::StatusOr<std::unique_ptr<Mixer>> make_gdn_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer);
absl::StatusOr<std::unique_ptr<Mixer>> make_gqa_mixer(const ModelConfig& cfg, const WeightLoader& w,
                                                      int layer);
absl::StatusOr<std::unique_ptr<Ffn>> make_dense_ffn(const ModelConfig& cfg, const WeightLoader& w,
                                                    const std::string& prefix, int width);
absl::StatusOr<std::unique_ptr<Ffn>> make_moe_ffn(const ModelConfig& cfg, const WeightLoader& w,
                                                  int layer);

}  // namespace loom
