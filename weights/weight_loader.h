// WeightLoader: canonical tensor names -> host tensors, through the family adapter, optionally
// into a ParameterArena in the dtypes of a Placement.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "weights/model_config.h"
#include "weights/parameter_arena.h"
#include "weights/safetensors.h"

namespace loom {

// Copies rows [src_row, src_row + n) of dimension 0 of `src` into rows [dst_row, dst_row + n) of
// `dst`: contiguous tensors of one dtype with the same shape past dimension 0, on any devices. For
// stored FP8 matrices (core/fp8_matrix.h) the rows' block scales go along (each row of dimension 0
// is one expert's matrix with its own blocks). Aborts on mismatched tensors.
void copy_expert_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row,
                      int64_t n);

class WeightLoader {
 public:
  static absl::StatusOr<WeightLoader> open(const std::string& dir, const ModelConfig& cfg);
  // A loader that invents deterministic random weights for whatever is asked (tests, the bundled
  // untrained default model). Same seed, same name and shape: same values (f32; a bf16 placement
  // rounds them).
  static WeightLoader synthetic(const ModelConfig& cfg, uint64_t seed);
  // Writes one tensor of a generated loader in place: `canonical`, the whole tensor's shape
  // `full`, the rows [rows.begin, rows.end) of its dimension 0 that `dst` holds (the placement's
  // experts of a routed-expert tensor, else every row) and `dst` itself: contiguous, of the
  // asked dtype, in the arena (on its device) when the loader is placed, else on the host.
  using Generator = std::function<absl::Status(std::string_view canonical, const Shape& full,
                                               ExpertRange rows, const Tensor& dst)>;
  // A loader whose tensors `generate` writes where they live (engine/model/random_weights.h):
  // nothing is read, and on a device nothing is staged on the host. Matrices kAuto: f32.
  static WeightLoader generated(const ModelConfig& cfg, Generator generate);

  // A copy of this loader that puts every tensor it loads into `arena` (not owned; it must
  // outlive the copy's loads) with the placement's dtypes: load() gives f32, load_matrix() and
  // load_experts() the placement's matrix dtype, load_experts() only the placement's experts.
  // The returned loader's placement() has its dtype resolved (kAuto: parameter_arena.h says
  // how). On a GPU placement every tensor is read and converted on
  // the host, then uploaded once into the (device) arena; whether the build and the machine have
  // that device is the caller's check (Model::load). InvalidArgument, naming the field, for an
  // arena on another device than the placement, an expert range that is empty or outside the
  // config's experts, or one given for a model without experts.
  absl::StatusOr<WeightLoader> placed(ParameterArena& arena, const Placement& placement) const;
  // The placement loads follow (the default one, f32 on the CPU, for an unplaced loader).
  const Placement& placement() const { return placement_; }
  // The dtype kAuto resolves to for this checkpoint: bf16 when every floating-point tensor of two
  // or more dimensions in it is bf16, f32 otherwise (and for synthetic weights).
  DType natural_matrix_dtype() const;

  // Every tensor a successful load returns is appended here, under its canonical name (used to
  // write a native checkpoint of exactly what a model loaded). Not owned; may be null.
  using Record = std::vector<std::pair<std::string, Tensor>>;
  void set_recorder(Record* record) { record_ = record; }

  // The tensor for `canonical` as contiguous f32 of exactly `shape`: for norm weights, biases,
  // gate parameters and anything else that stays f32 whatever the placement. The checkpoint
  // tensor may differ only by size-1 dimensions (conv weights [C, 1, W] load as [C, W]).
  // bf16/f16 are converted, FP8 dequantized; unplaced, f32 single tensors are zero-copy views of
  // the mapped file. Errors name the canonical and checkpoint tensors and both shapes.
  absl::StatusOr<Tensor> load(std::string_view canonical, const Shape& shape) const;
  // A GEMM weight matrix, stored in the placement's matrix dtype: a bf16 checkpoint tensor is
  // copied as bf16 bytes for a bf16 placement (never through f32); f32, f16 and dequantized FP8
  // values are rounded to bf16 once (round to nearest even). An fp8 placement keeps an FP8
  // checkpoint tensor's bytes and scales as they are (128 x 128 blocks; stacked or concatenated
  // parts too, when their row blocks line up) and quantizes anything else from its f32 values
  // (weights/fp8.h), except under a resolved kAuto, which keeps a matrix the checkpoint does not
  // store in FP8 in bf16 (stored in bf16) or f32.
  absl::StatusOr<Tensor> load_matrix(std::string_view canonical, const Shape& shape) const;
  // The routed experts' weights: `shape` is the whole layer's, [num_experts, ...]; the result is
  // the placement's experts only, [owned.count(), ...], in the matrix dtype. Only the owned
  // experts' bytes are read (per-expert checkpoint tensors) or copied (a stacked one), and only
  // their tensors need be in the checkpoint (NotFound names a missing one the load needs). A slot
  // placement (Placement::expert_slots) gives [slots, ...], slot s holding expert
  // expert_slots[s], in writable arena memory.
  absl::StatusOr<Tensor> load_experts(std::string_view canonical, const Shape& shape) const;
  // Whether the checkpoint holds (all parts of) `canonical`.
  bool has(std::string_view canonical) const;

 private:
  WeightLoader(std::shared_ptr<const Checkpoint> ckpt, ModelConfig cfg)
      : ckpt_(std::move(ckpt)), cfg_(std::move(cfg)) {}
  // Loads rows [rows.begin, rows.end) of dimension 0 of `canonical` (whole shape `shape`) as
  // `dtype`; `whole` when that is every row.
  absl::StatusOr<Tensor> load_as(std::string_view canonical, const Shape& shape, DType dtype,
                                 ExpertRange rows) const;
  absl::StatusOr<Tensor> load_from_checkpoint(std::string_view canonical, const Shape& shape,
                                              DType dtype, ExpertRange rows) const;
  Tensor invent(std::string_view canonical, const Shape& shape) const;
  // load_experts for a slot placement.
  absl::StatusOr<Tensor> load_expert_slots(std::string_view canonical, const Shape& shape) const;
  // load_as for an fp8 matrix dtype (load_matrix's comment).
  absl::StatusOr<Tensor> load_fp8(std::string_view canonical, const Shape& shape,
                                  ExpertRange rows) const;
  // The checkpoint's own FP8 bytes and scales for rows `rows` of `canonical`, copied into a stored
  // FP8 matrix; an undefined tensor when the checkpoint does not hold it as FP8 in 128 x 128
  // blocks that line up (then it is quantized from its f32 values).
  absl::StatusOr<Tensor> copy_stored_fp8(std::string_view canonical, const Shape& shape,
                                         ExpertRange rows) const;
  // Whether the checkpoint holds FP8 matrices in 128 x 128 blocks (kAuto then keeps them).
  bool holds_fp8_matrices() const;
  // A stored FP8 matrix to fill on the host: from a host arena when placed there, else fresh
  // (load_fp8 uploads it into a device arena).
  Tensor fp8_host_destination(std::string_view canonical, const Shape& shape) const;
  // Destination memory: from the arena when placed, else a fresh host tensor.
  Tensor destination(std::string_view canonical, const Shape& shape, DType dtype) const;

  std::shared_ptr<const Checkpoint> ckpt_;  // null for a synthetic or generated loader
  Generator generate_;                      // set for a generated loader
  ModelConfig cfg_;
  uint64_t seed_ = 0;
  Record* record_ = nullptr;
  ParameterArena* arena_ = nullptr;  // null: unplaced (fresh tensors and views of the file)
  Placement placement_;
  // Set when kAuto resolved to kFP8: matrices the checkpoint does not store in FP8 keep their
  // precision instead of being quantized.
  bool fp8_keeps_others_ = false;
  // With it, on a GPU with bf16 (or auto) activations: those matrices are stored in bf16 (an f32
  // one rounded once), since bf16 activations meet only bf16 or FP8 matrices there.
  bool fp8_others_bf16_ = false;
};

}  // namespace loom
