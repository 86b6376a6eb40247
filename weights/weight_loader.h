// WeightLoader: canonical tensor names -> host f32 tensors, through the family adapter.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "weights/model_config.h"
#include "weights/safetensors.h"

namespace loom {

class WeightLoader {
 public:
  static absl::StatusOr<WeightLoader> open(const std::string& dir, const ModelConfig& cfg);
  // A loader that invents deterministic random weights for whatever is asked (tests, the bundled
  // untrained default model). Same seed, same name and shape: same values.
  static WeightLoader synthetic(const ModelConfig& cfg, uint64_t seed);

  // Every tensor a successful load() returns is appended here, under its canonical name (used to
  // write a native checkpoint of exactly what a model loaded). Not owned; may be null.
  using Record = std::vector<std::pair<std::string, Tensor>>;
  void set_recorder(Record* record) { record_ = record; }

  // The tensor for `canonical` as contiguous f32 of exactly `shape`. The checkpoint tensor may
  // differ only by size-1 dimensions (conv weights [C, 1, W] load as [C, W]). bf16/f16 are
  // converted; f32 single tensors are zero-copy views of the mapped file. Errors name the
  // canonical and checkpoint tensors and both shapes.
  absl::StatusOr<Tensor> load(std::string_view canonical, const Shape& shape) const;
  // Whether the checkpoint holds (all parts of) `canonical`.
  bool has(std::string_view canonical) const;

 private:
  WeightLoader(std::shared_ptr<const Checkpoint> ckpt, ModelConfig cfg)
      : ckpt_(std::move(ckpt)), cfg_(std::move(cfg)) {}
  absl::StatusOr<Tensor> load_from_checkpoint(std::string_view canonical, const Shape& shape) const;
  Tensor invent(std::string_view canonical, const Shape& shape) const;

  std::shared_ptr<const Checkpoint> ckpt_;  // null for a synthetic loader
  ModelConfig cfg_;
  uint64_t seed_ = 0;
  Record* record_ = nullptr;
};

}  // namespace loom
