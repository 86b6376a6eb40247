// Where a model's weights live: a Placement (device, the storage dtype of the weight matrices, the
// experts this rank holds) and the ParameterArena that owns the memory of every loaded parameter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom {

// Experts [begin, end) of every MoE layer: those whose weights a rank holds and computes.
struct ExpertRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t count() const { return end - begin; }
  bool contains(int64_t expert) const { return expert >= begin && expert < end; }
  friend bool operator==(const ExpertRange&, const ExpertRange&) = default;
};

// The storage dtype of the weight matrices. kAuto keeps the checkpoint's precision: bf16 when
// every matrix of the checkpoint is stored in bf16 (so storing them in bf16 loses nothing); kFP8
// when the checkpoint holds FP8 matrices in 128 x 128 blocks (each of those kept as stored, the
// others in bf16 when stored in bf16, else f32: DeepSeek-V3 ships lm_head in bf16), on the CPU and
// on a GPU with bf16 or auto activations (there the others in bf16 always, the dtype bf16
// activations meet); f32 otherwise (f32 and f16 checkpoints, synthetic weights, a trainable model,
// and an FP8 checkpoint on a GPU asked for f32 activations: its matrices dequantized, the f32
// path). On a GPU with bf16 activations asked for, kAuto is bf16 for any checkpoint but an FP8 one.
// kFP8: every matrix as float8_e4m3fn with one f32 scale per 128 x 128 block (core/fp8_matrix.h):
// FP8 checkpoint tensors keep their bytes and scales, every other matrix is quantized at load
// (weights/fp8.h). On a GPU the values and scales are uploaded as one allocation per matrix and
// the FP8 GEMMs read them there (kernels/cuda/gemm_fp8.h, kernels/cuda/moe.h). Not trainable.
enum class WeightDType : uint8_t { kAuto, kF32, kBF16, kFP8 };

// "auto", "f32", "bf16" or "fp8" (flags); InvalidArgument naming the accepted values otherwise.
absl::StatusOr<WeightDType> parse_weight_dtype(std::string_view name);
std::string_view weight_dtype_name(WeightDType dtype);

// The dtype of the activations passed between ops. The residual stream (and Block-AttnRes's block
// sums), the recurrent states, the router's logits and gate weights, the decay gates and the
// logits stay f32 whatever this says; every other activation (GEMM inputs and outputs, q/k/v,
// attention and expert outputs, the norms' outputs) is stored in it, and every kernel computes
// in f32 and rounds on store. kAuto: bf16 on a GPU with bf16 matrices (the tensor cores then read
// GEMM inputs as they are, with no rounding pass), f32 otherwise. bf16 needs a GPU (the CPU
// backend computes in f32) and bf16 matrices.
enum class ActivationDType : uint8_t { kAuto, kF32, kBF16 };

// "auto", "f32" or "bf16" (flags); InvalidArgument naming the accepted values otherwise.
absl::StatusOr<ActivationDType> parse_activation_dtype(std::string_view name);
std::string_view activation_dtype_name(ActivationDType dtype);

// Where and how a model's parameters are stored. Which tensors follow `dtype`:
//  - the matrices of linear_forward and moe_grouped_swiglu (the GEMM weights): every projection of
//    the mixers, the dense and shared-expert FFNs, the routed experts, lm_head;
//  - everything else stays f32: norm weights, biases, gate parameters (A_log, dt_bias, the router
//    weight and its score bias, the shared-expert gate), the short-convolution weights, the
//    Block-AttnRes vectors, the embedding table (read by embedding_forward, f32 only) and MLA's
//    kv_b_proj (read inside mla_attention_varlen, f32 only).
// The CPU kernels widen bf16 matrices to f32 in registers or bounded scratch and accumulate in
// f32 (kernels/gemm.h), so a bf16 checkpoint stored in bf16 computes the same numbers as stored in
// f32, in half the memory. FP8 matrices are widened the same way, each value times its block's
// scale (one f32 product): the numbers of the dequantized f32 matrix, in a quarter of its memory.
// MLA's kv_b_proj stays f32 under kFP8 as under kBF16 (dequantized at load).
struct Placement {
  Device device = Device::kCpu;
  WeightDType dtype = WeightDType::kF32;
  // The activations' dtype (above); Model::load resolves kAuto (Model::act_dtype()).
  ActivationDType activations = ActivationDType::kAuto;
  // The routed experts this rank loads and computes; nullopt: all of them. The router always
  // covers every expert (engine/parallel: a LocalExpertDispatcher over this range).
  std::optional<ExpertRange> experts;
  // Instead of `experts`, a slot placement (expert parallelism with the load balancer,
  // engine/parallel/expert_load_balancer.h): the logical expert held in each of this rank's
  // physical expert slots, the same list for every MoE layer (redundant copies are slots of
  // other ranks). Each MoE layer then loads [slots, ...] expert weights, slot s holding expert
  // expert_slots[s], in memory that stays writable (a re-placement rewrites slots), and needs an
  // expert-parallel dispatcher bound to map experts to slots (Model::load refuses it otherwise).
  // Empty: no slot placement.
  std::vector<int32_t> expert_slots;
  // The trainer updates the parameters in place (f32 master weights): the arena stays writable
  // after the load instead of becoming read-only pages. Needs f32 matrices.
  bool trainable = false;
  // The arena stays writable after the load whatever the matrix dtype (an RL rollout engine whose
  // weights Engine::update_weights replaces from the trainer's), without training's f32 rule.
  bool writable = false;

  // The rows of dimension 0 of a layer's expert weights, for a layer of `num_experts` experts:
  // the owned range, or for a slot placement the slots [0, expert_slots.size()).
  ExpertRange owned_experts(int64_t num_experts) const {
    if (!expert_slots.empty()) return {0, static_cast<int64_t>(expert_slots.size())};
    return experts ? *experts : ExpertRange{0, num_experts};
  }
  // The dtype matrices are stored in once kAuto is resolved (kF32, kBF16 or kF8E4M3; kAuto gives
  // kF32). Under a resolved kAuto with FP8 (WeightLoader::placed), matrices the checkpoint does
  // not store in FP8 keep their own precision.
  DType matrix_dtype() const {
    return dtype == WeightDType::kBF16  ? DType::kBF16
           : dtype == WeightDType::kFP8 ? DType::kF8E4M3
                                        : DType::kF32;
  }
  // "cpu, bf16 matrices, experts [0, 8)" (or "all experts", or "expert slots 0 3 3 5").
  std::string describe() const;
};

// Owns the memory of a model's parameters on one device. Parameters are carved, aligned, from
// large chunks (one allocation per chunk, never one per tensor; a parameter larger than a chunk
// gets a chunk of its own size), kept under their canonical names, and immutable once freeze()
// is called at the end of the load: on the host the chunks then become read-only pages, so a
// stray write faults instead of silently changing the model (parameters allocated stays_writable,
// a slot placement's experts, live in chunks of their own that stay writable). Tensors handed out
// keep their chunk alive, so views outlive the arena safely.
class ParameterArena {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t{64} << 20;
  static constexpr size_t kAlignment = 256;  // every parameter's first byte

  explicit ParameterArena(Device device, size_t chunk_bytes = kDefaultChunkBytes);
  ParameterArena(const ParameterArena&) = delete;
  ParameterArena& operator=(const ParameterArena&) = delete;
  ~ParameterArena();

  Device device() const { return device_; }

  // Uninitialised contiguous memory for the parameter `name`. Aborts after freeze() (parameters
  // are immutable after the load) and for a name given twice. `stays_writable`: carved from
  // chunks of their own that freeze() leaves writable (the routed experts of a slot placement,
  // whose slots an expert re-placement rewrites: engine/parallel/expert_weight_transfer.h).
  Tensor allocate(std::string_view name, const Shape& shape, DType dtype,
                  bool stays_writable = false);
  // A stored FP8 matrix (core/fp8_matrix.h): the f8e4m3 tensor of `shape` with its block scales
  // in the same allocation (values and scales uninitialised; fp8_matrix_scales finds them).
  Tensor allocate_fp8(std::string_view name, const Shape& shape, bool stays_writable = false);
  // Ends the load: no allocation afterwards; with `read_only`, host chunks become read-only
  // pages (a model being trained keeps them writable), except those of stays_writable ones.
  void freeze(bool read_only = true);
  bool frozen() const { return frozen_; }

  // Bytes of the parameters themselves (all, or those of one dtype; an FP8 matrix counts its
  // scales too).
  size_t bytes() const { return bytes_; }
  size_t bytes(DType dtype) const;
  // Bytes of the chunks (parameters plus alignment padding and the last chunk's unused tail; on
  // the host, untouched pages of that tail are never resident).
  size_t reserved_bytes() const { return reserved_; }
  size_t num_chunks() const { return chunks_.size(); }

  struct Entry {
    std::string name;
    Tensor tensor;
  };
  // Every parameter in load order.
  const std::vector<Entry>& entries() const { return entries_; }
  // The parameter loaded under `name`, or null.
  const Tensor* find(std::string_view name) const;

 private:
  struct Chunk {
    std::shared_ptr<void> memory;
    size_t size = 0;
    bool writable = false;  // of stays_writable parameters: freeze() leaves it writable
  };
  std::shared_ptr<void> allocate_chunk(size_t bytes);
  Tensor carve(std::string_view name, const Shape& shape, DType dtype, size_t bytes, bool writable);

  Device device_;
  size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  // Per kind (0: frozen with the load, 1: stays writable): the chunk parameters of that kind are
  // carved from (-1: none yet) and the bytes carved from it.
  int64_t current_[2] = {-1, -1};
  size_t used_[2] = {0, 0};
  size_t bytes_ = 0, reserved_ = 0;
  bool frozen_ = false;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> entries_ index
};

}  // namespace loom
