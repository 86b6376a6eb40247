// The building blocks of a decoder layer: token mixers (KDA, MLA, ...) and FFNs (dense, MoE).
// Each is built from ModelConfig plus the checkpoint (through WeightLoader's canonical names) and
// runs on a whole varlen batch: token-parallel work (projections, norms, FFNs) over all rows at
// once, sequence-ordered work (convolution, recurrence, attention) in one varlen kernel call that
// finds each sequence's cache in the step's CacheStore by slot id and page table.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "engine/model/cache_store.h"
#include "kernels/exec.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

// Where each sequence's rows sit in the flattened batch and where its caches live: a state slot and
// a page-table row of `store` (private caches are staged into a store too: Model::forward). Every
// field is a view of the step's StepData, which the kernels read as it is: sequence-ordered work
// (convolution, recurrence, attention, cache writes) is one varlen kernel call per layer.
struct BatchLayout {
  Tensor positions;    // i64 [N] absolute position of every row
  Tensor logit_rows;   // i64 [R] rows whose logits are computed
  Tensor cu_seqlens;   // i64 [B + 1] first row of each sequence, then N
  Tensor past_lens;    // i64 [B] positions each sequence had cached before this step
  Tensor state_slots;  // i32 [B] linear-attention state slot of each sequence
  Tensor page_table;   // i32 [B, P] attention pages of each sequence
  int64_t num_rows = 0;
  CacheStore* store = nullptr;  // never null in a forward
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
