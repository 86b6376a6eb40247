// What a step of a model must move and compute at the least, from its parameters as loaded and its
// config: the byte and FLOP counts `loom-bench offline` divides by the ceilings it measures (a
// device copy, a bf16 GEMM) to print a roofline beside every figure.
#pragma once

#include <cstdint>

#include "engine/model/model.h"

namespace loom::bench {

struct ModelFootprint {
  // Bytes of the parameters a decode step reads whatever the batch (everything but the routed
  // experts and the embedding table, of which a step reads one row a token).
  int64_t dense_bytes = 0;
  // Bytes of one routed expert of one MoE layer, summed over the MoE layers; and their count.
  int64_t expert_bytes_all_layers = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  // Parameters multiplied per token in a forward: everything but the embedding table, with top_k
  // routed experts per MoE layer (and the shared ones).
  int64_t active_params = 0;
  // Per sequence: linear-attention state bytes (read and written each step) and attention cache
  // bytes per cached token (read by each decode step over the whole context).
  int64_t state_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  // Attention FLOPs of a causal prefill of T tokens = attention_flops_per_token_pair * T^2 / 2.
  int64_t attention_flops_per_token_pair = 0;
};

// From the loaded model (its arena says what each tensor weighs) and the cache dtypes the engine
// uses.
ModelFootprint model_footprint(const Model& model, DType kv_dtype);

// Expected distinct experts of one layer that `tokens` tokens route to, top_k of num_experts each
// and uniformly: E * (1 - (1 - k/E)^tokens).
double expected_experts_touched(int64_t num_experts, int64_t top_k, int64_t tokens);

// Least bytes of one decode step of `batch` sequences with `context` cached tokens each.
double decode_step_bytes(const ModelFootprint& f, int64_t batch, int64_t context);

// FLOPs of a prefill of `tokens` tokens from position 0 (GEMMs and causal attention).
double prefill_flops(const ModelFootprint& f, int64_t tokens);

}  // namespace loom::bench
