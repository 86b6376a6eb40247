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
#include "engine/model/forward_context.h"
#include "engine/model/gradients.h"
#include "kernels/exec.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {

class Mixer {
 public:
  virtual ~Mixer() = default;
  // x: [N, D] normalised input; out: [N, D] (overwritten). `layer` indexes the caches.
  virtual void forward(const ForwardContext& ctx, const Tensor& x, int layer,
                       const Tensor& out) const = 0;
  // Training: the gradient of forward(x) given d_out. Recomputes what it needs from x (nothing but
  // the layer inputs is kept between forward and backward), writes d_x [N, D] and accumulates
  // every parameter's gradient into `grads` under its canonical name. Every sequence of ctx.batch
  // must start from a fresh state (past length 0). Mixers without a backward say so.
  virtual absl::Status backward(const ForwardContext& ctx, const Tensor& x, int layer,
                                const Tensor& d_out, const Tensor& d_x, Gradients& grads) const;
  // Rebuilds the rotary table from `rope` (the model's RopeConfig after Model::set_rope_theta) on
  // `device`. Returns whether this mixer rotates at all; mixers without RoPE ignore the call.
  virtual bool rebuild_rope(const RopeConfig& /*rope*/, Device /*device*/) { return false; }
};

class Ffn {
 public:
  virtual ~Ffn() = default;
  // x: [N, D]; out: [N, D] (overwritten).
  virtual void forward(const ForwardContext& ctx, const Tensor& x, const Tensor& out) const = 0;
  // Training, as Mixer::backward.
  virtual absl::Status backward(const ForwardContext& ctx, const Tensor& x, const Tensor& d_out,
                                const Tensor& d_x, Gradients& grads) const;
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
