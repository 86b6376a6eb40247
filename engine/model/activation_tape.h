// ActivationTape: the tensors a forward keeps for later, by (layer, name). A trainer passes one to
// save what its backward pass needs; conformance passes one to compare every layer's hidden state
// with the reference's. Layers write their intermediates into workspace memory that the next
// layer reuses, so the tape copies what it records; a forward without a tape copies nothing.
//
// Names recorded by Model::forward (layer -1 is the model itself):
//   (-1, "embedding")     [N, D] the token embeddings
//   (l,  "residual")      [N, D] the residual stream entering layer l (plain pre-norm residuals)
//   (l,  "mixer_in")      [N, D] the normalised input of layer l's token mixer
//   (l,  "mixer_out")     [N, D] layer l's token mixer output (what it adds to the residual)
//   (l,  "ffn_in")        [N, D] the normalised input of layer l's FFN
//   (l,  "ffn_out")       [N, D] layer l's FFN output
//   (l,  "expert_ids")    [N, top_k] i32, MoE layers only: the experts each row was routed to
//                         (the router's choice, or the replayed one under routing replay)
//   (-1, "final_normed")  [N, D] the final normalised hidden state of every row
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/tensor.h"
#include "core/workspace.h"
#include "kernels/exec.h"

namespace loom {

class ActivationTape {
 public:
  // Keeps the named tensors only; no names: keeps everything recorded.
  explicit ActivationTape(std::vector<std::string> names = {});

  // Where record() keeps its copies: by default each is a tensor of its own (an allocation and a
  // synchronising copy on a GPU); with this, views taken from `memory` (which must outlive the
  // records and not be reset while they are read) filled by an asynchronous copy on `ex`'s stream,
  // what a training step does so that its forward never waits for the GPU.
  void keep_in(const Exec& ex, Workspace* memory);

  // Whether record() keeps `name` (layers skip the copy otherwise).
  bool wants(std::string_view name) const;
  // Copies `value` under (layer, name) if wanted, replacing an earlier record of that key.
  void record(int layer, std::string_view name, const Tensor& value);
  // The recorded tensor, or null.
  const Tensor* find(int layer, std::string_view name) const;

  struct Entry {
    int layer;
    std::string name;
    Tensor value;
  };
  // In the order first recorded (a backward pass walks it in reverse).
  const std::vector<Entry>& entries() const { return entries_; }
  size_t bytes() const;
  void clear();

 private:
  std::vector<std::string> names_;
  std::optional<Exec> exec_;     // keep_in's
  Workspace* memory_ = nullptr;  // keep_in's
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::pair<int, std::string>, size_t> index_;
};

}  // namespace loom
