// CacheStore: the serving engine's cache memory for many sequences. Attention layers keep their
// rows in pools of fixed-size pages (MLA: the normalised latent and the rope key, nothing else;
// GQA: rotated keys and values); linear-attention layers keep one state per slot (recurrent
// [Hv, dk, dv] f32 and the convolution tail [W-1, C]). The scheduler hands out page and slot ids;
// this class only owns the bytes and what they mean (TurboMind's cache-registry split).
//
// The pools live on the store's device, pages in the KV dtype, recurrent states always in f32
// (they accumulate over the whole sequence) and convolution tails in the activation dtype (they
// are activations). Resets and copies are kernel ops (kernels/cache_ops.h) on the device's
// stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/exec.h"
#include "weights/model_config.h"

namespace loom {

// The KV page dtype a user names (--kv_dtype on loom-server and loom-bench-engine): "auto" (unset:
// the activations' dtype), "f32", "bf16", or "fp8" (DType::kF8E4M3: e4m3 with one f32 scale per
// cached vector, kernels/attention.h). InvalidArgument for anything else.
absl::StatusOr<std::optional<DType>> parse_kv_dtype(std::string_view name);

class CacheStore {
 public:
  // Page 0 and slot 0 of the engine's store are scratch: the scheduler never hands them to a
  // request (KvPagePool::kScratchPage, StateSlotPool::kScratchSlot), so padded entries of a
  // step's page table and state slots can point at them without touching a live sequence. Stores
  // no scheduler manages (SequenceCache, the staged store of Model::forward) use them as real
  // page and slot and never pad.
  static constexpr int32_t kScratchPage = 0;
  static constexpr int32_t kScratchSlot = 0;

  struct Options {
    int64_t num_pages = 0;   // pages of every attention layer's pool (ids 0 .. num_pages-1)
    int64_t page_size = 64;  // positions per page
    int64_t num_slots = 0;   // linear-state slots (ids 0 .. num_slots-1)
    Device device = Device::kCpu;
    DType kv_dtype = DType::kF32;   // the page pools: f32, bf16 or kF8E4M3 (fp8)
    DType act_dtype = DType::kF32;  // the convolution tails
  };

  // Validates the options (InvalidArgument naming what is wrong: a dtype the device's kernels
  // cannot read, a CUDA device in a build without CUDA, negative sizes), then allocates and
  // zeroes every pool. Models without attention (or linear) layers hold no pages (or slots)
  // whatever the options say.
  static absl::StatusOr<std::unique_ptr<CacheStore>> create(const ModelConfig& cfg,
                                                            const Options& options);
  static absl::Status validate(const ModelConfig& cfg, const Options& options);
  // The same for options known to be valid (the defaults on the host); aborts otherwise.
  CacheStore(const ModelConfig& cfg, const Options& options);

  // Bytes one cached position costs in each attention layer, in layer order: the one place that
  // knows what a page holds. Cache sizing takes this vector; page_bytes is its sum times the page
  // size.
  static std::vector<int64_t> kv_bytes_per_token(const ModelConfig& cfg,
                                                 DType kv_dtype = DType::kF32);
  // Bytes one page costs over all attention layers, and one slot over all linear layers: what the
  // engine divides its memory budget by.
  static size_t page_bytes(const ModelConfig& cfg, int64_t page_size, DType kv_dtype = DType::kF32);
  static size_t slot_bytes(const ModelConfig& cfg, DType act_dtype = DType::kF32);

  int64_t num_pages() const { return options_.num_pages; }
  int64_t page_size() const { return options_.page_size; }
  int64_t num_slots() const { return options_.num_slots; }
  Device device() const { return options_.device; }
  DType kv_dtype() const { return options_.kv_dtype; }
  DType act_dtype() const { return options_.act_dtype; }
  bool has_attention() const { return has_attention_; }
  bool has_linear() const { return has_linear_; }

  // Layer `layer`'s pool `which` (MLA: 0 latent [P, page, R], 1 rope [P, page, dr]; GQA: 0 key,
  // 1 value [P, page, Hkv, d]; under fp8 each last dimension is 4 bytes longer, for the vector's
  // scale: kv_pool_last_dim). The layer must be an attention layer.
  const Tensor& pool(int layer, int which) const;
  // Slot `slot`'s state of linear layer `layer`.
  Tensor recurrent(int layer, int64_t slot) const;  // [Hv, dk, dv]
  Tensor conv(int layer, int64_t slot) const;       // [W-1, C]
  // Every slot's state of linear layer `layer` (what the varlen kernels index by slot id).
  const Tensor& recurrent_states(int layer) const;  // [num_slots, Hv, dk, dv]
  const Tensor& conv_states(int layer) const;       // [num_slots, W-1, C]

  // Zeroes every linear layer's state in `slot` (a sequence starting fresh).
  void reset_slot(int64_t slot);
  // Zeroes page `page` of every attention layer's pools (the decode graphs' scratch page, so that
  // a padding row's attention never meets a stale non-finite value in a tile it loads).
  void reset_page(int64_t page);
  // Copies every linear layer's state from `src` to `dst` (prefix-cache checkpoints).
  void copy_slot(int64_t src, int64_t dst) { copy_slot(*this, src, dst); }
  // The same from slot `src` of `from`, a store of the same model on the same device.
  void copy_slot(const CacheStore& from, int64_t src, int64_t dst);
  // Copies rows [r0, r1) of page `src` of `from` (a store of the same model on the same device)
  // into the same rows of page `dst`, in every attention layer. Both stores' pages must hold r1
  // rows.
  void copy_page_rows(const CacheStore& from, int64_t src, int64_t dst, int64_t r0, int64_t r1);

  // A sequence's cache in host memory (offload, engine/session_offload.h): pages `pages` of every
  // attention layer's pools and state slot `slot` (-1: none) of every linear layer, packed in
  // that order, whole pages and slots. sequence_bytes is their size; save_sequence enqueues the
  // device-to-host copies into `host` (its bytes are there once synchronize(exec()) returns);
  // load_sequence enqueues the copies back into pages and a slot of the same shape (`host` must
  // stay untouched until the stream has passed them). On a GPU `host` must be page-locked
  // (allocate_transfer_buffer): both enqueue one batch of copies (kernels/exec.h's
  // copy_batch_async).
  size_t sequence_bytes(int64_t num_pages, bool slot) const;
  void save_sequence(std::span<const int32_t> pages, int64_t slot, void* host) const;
  void load_sequence(const void* host, std::span<const int32_t> pages, int64_t slot);
  const Exec& exec() const { return ex_; }

 private:
  struct Layer {
    Tensor pools[2];   // attention layers
    Tensor recurrent;  // [num_slots, Hv, dk, dv]
    Tensor conv;       // [num_slots, W-1, C]
  };
  void check_peer(const CacheStore& from, const char* op) const;
  // One walk over sequence_bytes' packed layout for both directions: copy(item, offset, bytes).
  template <typename Fn>
  void walk_sequence(std::span<const int32_t> pages, int64_t slot, Fn&& copy) const;

  Options options_;
  Exec ex_;  // the device's: every reset and copy is enqueued on its stream
  std::vector<Layer> layers_;
  bool has_attention_ = false, has_linear_ = false;
};

}  // namespace loom
