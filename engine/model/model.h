// Model: a hybrid decoder built from ModelConfig and a checkpoint, run on varlen batches.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/model/activation_tape.h"
#include "engine/model/forward_batch.h"
#include "engine/model/gradients.h"
#include "engine/model/layers.h"
#include "weights/model_config.h"
#include "weights/parameter_arena.h"
#include "weights/weight_loader.h"

namespace loom {

// One sequence of a packed training call (Model::loss_and_gradients_packed): its tokens, from a
// fresh state at position 0, with the optional loss mask and row weights of loss_and_gradients.
struct TrainingSequence {
  std::span<const int32_t> tokens;
  std::span<const uint8_t> loss_mask = {};
  std::span<const float> row_weights = {};
};

class Model {
 public:
  // Loads DIR/config.json and the checkpoint in DIR (any supported family) into a parameter
  // arena with `placement` (weights/parameter_arena.h: device, the matrices' storage dtype, the
  // experts this rank holds; the default: the CPU, f32, every expert). Errors name the field or
  // tensor at fault, or the part of the placement this build cannot honour.
  static absl::StatusOr<std::unique_ptr<Model>> load(const std::string& dir,
                                                     const Placement& placement = {});
  static absl::StatusOr<std::unique_ptr<Model>> load(const std::string& dir, const ModelConfig& cfg,
                                                     const Placement& placement = {});
  // Builds the model from any weight source (a checkpoint, or WeightLoader::synthetic).
  static absl::StatusOr<std::unique_ptr<Model>> load(const ModelConfig& cfg,
                                                     const WeightLoader& weights,
                                                     const Placement& placement = {});

  // A model with random weights (engine/model/random_weights.h) for the config.json at `path` (the
  // file, or a directory holding it; any supported family), filled where `placement` puts them
  // from `seed`: the same values on every device. Placement kAuto: bf16 matrices on a GPU, f32 on
  // the host. Errors name the file and field, or the placement part this build cannot honour.
  static absl::StatusOr<std::unique_ptr<Model>> load_random(const std::string& path, uint64_t seed,
                                                            const Placement& placement = {});

  // The placement the weights were loaded with (its dtype resolved: kF32 or kBF16) and the arena
  // holding every parameter (frozen: immutable).
  const Placement& placement() const { return placement_; }
  const ParameterArena& parameters() const { return *arena_; }

  const ModelConfig& config() const { return cfg_; }
  // A fresh private cache for one sequence (position 0), on the model's device.
  SequenceCache new_cache() const { return SequenceCache(cfg_, placement_.device, act_dtype_); }
  Device device() const { return placement_.device; }
  // The activations' dtype (Placement::activations resolved: kF32 or kBF16). The engine stores
  // the convolution tails of its state slots in it.
  DType act_dtype() const { return act_dtype_; }

  // Runs the batch, extending each sequence's cache by its new tokens. Returns logits [rows, V]
  // for the rows each sequence asked for (LogitsMode), in sequence order. InvalidArgument for a
  // malformed batch (token id out of range, lengths not matching token_ids, no cache, private
  // caches mixed with store-backed sequences, a cache, slot or page used twice, a slot or page out
  // of range); the caches' contents are untouched then (a private cache may have grown).
  // If `tape` is not null, the forward records on it what it wants (activation_tape.h names
  // them): a trainer's saved activations, or every layer's hidden state for conformance.
  // The logits live on the model's device. With ForwardBatch::workspace set (on that device), the
  // call resets that workspace first and the logits are a view into it, valid until its next
  // reset; otherwise they own their memory. ForwardBatch::step, if set, must be on the model's
  // device too. On a GPU the call returns once the work is enqueued on the device's stream;
  // reading the logits (Tensor::to, kernels/exec.h download) waits for it.
  absl::StatusOr<Tensor> forward(const ForwardBatch& batch, ActivationTape* tape = nullptr) const;

  // A store-backed forward in two halves, for a caller that records the second as a CUDA graph
  // and replays it (engine/decode_graphs.h). prepare() validates the batch and publishes its step
  // data (the step's one upload); launch() resets the workspace and enqueues every kernel of the
  // forward over that layout, returning the logits (a view into the workspace). Once the
  // workspace has seen the step's shape, launch() neither allocates nor waits for the device.
  // Both need batch.step and batch.workspace; forward() of such a batch is the two in a row.
  absl::StatusOr<BatchLayout> prepare(const ForwardBatch& batch) const;
  Tensor launch(const ForwardBatch& batch, const BatchLayout& layout) const;

  // Training (CPU, f32): the mean next-token cross-entropy of `tokens` (position t predicts token
  // t + 1, from a fresh state) over the scored positions (all, or those with loss_mask[t] != 0;
  // the mask has one entry per token, the last never scored) and its gradient with respect to
  // every parameter, accumulated into `grads` under canonical names (model_training.cc). It runs
  // on the model's device (f32 activations); `grads` must be empty or on that device.
  absl::StatusOr<double> loss_and_gradients(std::span<const int32_t> tokens, Gradients& grads,
                                            std::span<const uint8_t> loss_mask = {},
                                            std::vector<float>* row_loss = nullptr,
                                            std::span<const float> row_weights = {},
                                            RoutingReplay* routing_replay = nullptr) const;
  // With `row_loss` set, it also receives each position's loss (n entries: row_loss[t] for
  // predicting token t + 1, 0 at unscored positions and at the last), the same bits with or
  // without it. With `row_weights` (n entries) the objective is the weighted sum
  // sum_t row_weights[t] * row_loss[t] over the scored positions instead of the mean (a policy
  // gradient's per-token weights, trainer/rl); it is what the call returns then. With
  // `routing_replay` (routing_replay.h: [n, top_k] per MoE layer) the MoE layers route to the
  // given experts in the forward and in the backward's recomputation, the gate weights and their
  // gradient coming from the router's own logits; its counters count the forward's slots once.

  // Several sequences in one forward and one backward over their varlen batch (each from a fresh
  // state at position 0): every GEMM sees all their rows, which is what makes a micro-batch fast
  // on a GPU. The objective is the sum over the sequences of what loss_and_gradients would
  // optimise for each (its mean, or its weighted sum with row_weights; plus, with
  // Gradients::aux_loss_alpha, its own load-balancing loss), so the gradients are the sum of the
  // per-sequence calls' up to f32 summation order. Returns each sequence's objective (its mean or
  // weighted sum) in order; `row_loss` receives the sequences' row losses concatenated. With
  // `routing_replay`, its tensors cover the concatenated rows. The errors of loss_and_gradients,
  // naming the sequence; InvalidArgument for no sequences. One sequence is exactly
  // loss_and_gradients (model_training.cc).
  absl::StatusOr<std::vector<double>> loss_and_gradients_packed(
      std::span<const TrainingSequence> seqs, Gradients& grads,
      std::vector<float>* row_loss = nullptr, RoutingReplay* routing_replay = nullptr) const;

  // Changes the RoPE base of the rotary layers (config().rope.theta) and rebuilds their rotary
  // tables (staged context extension: a longer stage trains with a larger base). Returns how many
  // layers rotate (0: the model has no rotary layers and the call changed nothing but the config).
  // Setting the original theta back gives the original tables, bit for bit. Not to be called while
  // a forward runs (model_rope.cc).
  int set_rope_theta(double theta);

  // f32 GEMMs of more than one row on TF32 or bf16 tensor cores from now on (Exec::matmul), in
  // every forward and backward of this model: the trainer's `matmul`. kF32 goes back.
  // InvalidArgument on the CPU, which has no such unit. Not to be called while a forward runs.
  absl::Status set_matmul_precision(MatmulPrecision precision);
  MatmulPrecision matmul_precision() const { return matmul_; }

 private:
  explicit Model(ModelConfig cfg) : cfg_(std::move(cfg)) {}

  // The one forward: every sequence has a slot and a page table in batch.store.
  absl::StatusOr<Tensor> forward_store(const ForwardBatch& batch, ActivationTape* tape) const;
  // Runs private caches through forward_store (see there).
  absl::StatusOr<Tensor> forward_private(const ForwardBatch& batch, ActivationTape* tape) const;
  // InvalidArgument unless the batch's store, step data and workspace (those set) are on the
  // model's device.
  absl::Status check_devices(const ForwardBatch& batch) const;
  // Every kernel of the forward over a packed layout (resets ex.workspace first).
  Tensor launch_layers(const Exec& ex, const BatchLayout& layout, ActivationTape* tape,
                       RoutingReplay* routing_replay, bool training) const;
  // Validates a store batch and packs its step data into `step`.
  absl::StatusOr<BatchLayout> make_layout(const ForwardBatch& batch, const Exec& ex,
                                          StepData& step) const;
  // The two residual schemes: plain pre-norm residuals, or Block Attention Residuals.
  Tensor run_plain_residual(const ForwardContext& ctx, Tensor h) const;
  Tensor run_block_attnres(const ForwardContext& ctx, const Tensor& embedding) const;
  // The backward of each residual scheme, from the gradient of the final normalised rows to the
  // embedding's (written into d_embedding).
  absl::Status backward_plain_residual(const ForwardContext& ctx, const ActivationTape& tape,
                                       const Tensor& d_normed, const Tensor& d_embedding,
                                       Gradients& grads) const;
  absl::Status backward_block_attnres(const ForwardContext& ctx, const ActivationTape& tape,
                                      const Tensor& d_normed, const Tensor& d_embedding,
                                      Gradients& grads) const;

  struct Layer {
    Tensor mixer_norm, ffn_norm;
    Tensor mixer_res_proj, mixer_res_norm, ffn_res_proj, ffn_res_norm;  // AttnRes only
    std::unique_ptr<Mixer> mixer;
    std::unique_ptr<Ffn> ffn;
  };
  ModelConfig cfg_;
  DType act_dtype_ = DType::kF32;  // activations between ops (Placement::activations)
  Tensor embed_, final_norm_, lm_head_;
  Tensor final_res_proj_, final_res_norm_;  // AttnRes only
  std::vector<Layer> layers_;
  std::unique_ptr<ParameterArena> arena_;  // owns every tensor above (and the layers')
  Placement placement_;
  MatmulPrecision matmul_ = MatmulPrecision::kF32;  // set_matmul_precision
  // loss_and_gradients' step memory (its forward's and its backward's workspaces and step data,
  // the activation tape's copies), kept from call to call so that a step stops allocating once
  // the first one has set the high-water marks: each cudaMalloc and cudaFree synchronises the
  // GPU, and a synchronisation leaves it idle while the host queues the next kernels. A call that
  // finds them in use by another thread takes fresh ones.
  // A packed call's forward also keeps its cache store (slot s and page s for sequence s), grown
  // when a call has more or longer sequences than it holds.
  struct TrainingMemory {
    explicit TrainingMemory(Device device)
        : forward(device),
          backward(device),
          tape(device),
          forward_step(device),
          backward_step(device) {}
    Workspace forward, backward;
    Workspace tape;  // the activation tape's copies (ActivationTape::keep_in)
    StepData forward_step, backward_step;
    std::unique_ptr<CacheStore> store;
  };
  mutable std::mutex training_mu_;
  mutable std::unique_ptr<TrainingMemory> training_memory_;
};

}  // namespace loom
