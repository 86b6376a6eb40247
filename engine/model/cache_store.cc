#include "engine/model/cache_store.h"

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/cache_ops.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/context.h"
#endif

namespace loom {
namespace {

int64_t conv_channels(const LinearAttentionConfig& la) {
  return 2LL * la.num_heads * la.head_dim + static_cast<int64_t>(la.num_v_heads) * la.v_head_dim;
}

bool is_linear(MixerType m) { return m == MixerType::kKda || m == MixerType::kGdn; }

size_t item_bytes(const Tensor& pool) { return pool.stride(0) * dtype_size(pool.dtype()); }

char* item_ptr(const Tensor& pool, int64_t i) {
  return static_cast<char*>(pool.raw()) + i * item_bytes(pool);
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

Exec exec_on(Device device) {
  if (device.is_cpu()) return host_exec();
#ifdef LOOM_WITH_CUDA
  return cuda::device_exec(device.index);
#else
  LOOM_CHECK(false, "CacheStore on %s in a build without CUDA", device_name(device).c_str());
  return host_exec();
#endif
}

}  // namespace

absl::StatusOr<std::optional<DType>> parse_kv_dtype(std::string_view name) {
  if (name == "auto") return std::optional<DType>();
  if (name == "f32") return std::optional<DType>(DType::kF32);
  if (name == "bf16") return std::optional<DType>(DType::kBF16);
  if (name == "fp8") return std::optional<DType>(DType::kF8E4M3);
  return absl::InvalidArgumentError(
      absl::StrCat("kv_dtype '", std::string(name), "': must be auto, f32, bf16 or fp8"));
}

std::vector<int64_t> CacheStore::kv_bytes_per_token(const ModelConfig& cfg, DType kv_dtype) {
  // The pools' own shapes (kv_pool_last_dim: fp8 vectors carry a 4-byte scale each).
  const int64_t es = static_cast<int64_t>(dtype_size(kv_dtype));
  std::vector<int64_t> out;
  for (MixerType m : cfg.mixers) {
    if (m == MixerType::kMla)
      out.push_back(es * (kv_pool_last_dim(kv_dtype, cfg.mla.kv_lora_rank) +
                          kv_pool_last_dim(kv_dtype, cfg.mla.qk_rope_head_dim)));
    if (m == MixerType::kGqa)
      out.push_back(es * 2 * cfg.gqa.num_kv_heads * kv_pool_last_dim(kv_dtype, cfg.gqa.head_dim));
  }
  return out;
}

size_t CacheStore::page_bytes(const ModelConfig& cfg, int64_t page_size, DType kv_dtype) {
  const std::vector<int64_t> per_token = kv_bytes_per_token(cfg, kv_dtype);
  return static_cast<size_t>(std::accumulate(per_token.begin(), per_token.end(), int64_t{0}) *
                             page_size);
}

size_t CacheStore::slot_bytes(const ModelConfig& cfg, DType act_dtype) {
  const LinearAttentionConfig& la = cfg.linear;
  const size_t recurrent =
      static_cast<size_t>(la.num_v_heads) * la.head_dim * la.v_head_dim * dtype_size(DType::kF32);
  const size_t conv =
      static_cast<size_t>(la.conv_kernel - 1) * conv_channels(la) * dtype_size(act_dtype);
  size_t bytes = 0;
  for (MixerType m : cfg.mixers)
    if (is_linear(m)) bytes += recurrent + conv;
  return bytes;
}

absl::Status CacheStore::validate(const ModelConfig& cfg, const Options& o) {
  if (o.page_size <= 0 || o.num_pages < 0 || o.num_slots < 0)
    return absl::InvalidArgumentError(absl::StrCat("CacheStore: ", o.num_pages, " pages of ",
                                                   o.page_size, " positions and ", o.num_slots,
                                                   " slots"));
  if (static_cast<int>(cfg.mixers.size()) != cfg.num_layers)
    return absl::InvalidArgumentError(
        absl::StrCat("CacheStore: ", cfg.mixers.size(), " mixers for ", cfg.num_layers, " layers"));
  const std::pair<const char*, DType> dtypes[] = {{"kv_dtype", o.kv_dtype},
                                                  {"act_dtype", o.act_dtype}};
  for (const auto& [what, dtype] : dtypes) {
    if (!is_float(dtype) && !(dtype == DType::kF8E4M3 && what == dtypes[0].first))
      return absl::InvalidArgumentError(absl::StrCat(
          "CacheStore: ", what, " ", std::string(dtype_name(dtype)), " is not a float type"));
  }
  // Both backends' attention kernels read f32, bf16 or fp8 pages (e4m3 with a scale per vector,
  // kernels/attention.h: the CPU's widen or dequantize a page at a time, the GPU's as each key
  // tile loads); the convolution tails follow the activations: f32, or bf16 on a GPU.
  if (o.kv_dtype != DType::kF32 && o.kv_dtype != DType::kBF16 && o.kv_dtype != DType::kF8E4M3)
    return absl::InvalidArgumentError(
        absl::StrCat("CacheStore: kv_dtype ", std::string(dtype_name(o.kv_dtype)), " on ",
                     device_name(o.device), ": use f32, bf16 or fp8"));
  if (o.act_dtype != DType::kF32 && !(o.act_dtype == DType::kBF16 && o.device.is_cuda()))
    return absl::InvalidArgumentError(
        absl::StrCat("CacheStore: act_dtype ", std::string(dtype_name(o.act_dtype)), " on ",
                     device_name(o.device), ": convolution tails are f32, or bf16 on a GPU"));
#ifndef LOOM_WITH_CUDA
  if (o.device.is_cuda())
    return absl::InvalidArgumentError(
        absl::StrCat("CacheStore on ", device_name(o.device), ": this build has no CUDA backend"));
#endif
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CacheStore>> CacheStore::create(const ModelConfig& cfg,
                                                               const Options& options) {
  if (absl::Status st = validate(cfg, options); !st.ok()) return st;
  return std::make_unique<CacheStore>(cfg, options);
}

CacheStore::CacheStore(const ModelConfig& cfg, const Options& options) : options_(options) {
  const absl::Status valid = validate(cfg, options);
  LOOM_CHECK(valid.ok(), "%s", std::string(valid.message()).c_str());
  ex_ = exec_on(options.device);
  layers_.resize(cfg.num_layers);
  const LinearAttentionConfig& la = cfg.linear;
  const int64_t p = options.num_pages, ps = options.page_size, s = options.num_slots;
  const Device dev = options.device;
  // Zeroed by the kernels, on the device: nothing is staged through the host.
  auto zeroed = [&](Shape shape, DType dtype) {
    Tensor t = Tensor::empty(shape, dtype, dev);
    cache_zero_slots(ex_, t, 0, shape[0]);
    return t;
  };
  for (int l = 0; l < cfg.num_layers; ++l) {
    Layer& layer = layers_[l];
    switch (cfg.mixers[l]) {
      case MixerType::kMla:
        has_attention_ = true;
        layer.pools[0] = zeroed({p, ps, kv_pool_last_dim(options.kv_dtype, cfg.mla.kv_lora_rank)},
                                options.kv_dtype);
        layer.pools[1] =
            zeroed({p, ps, kv_pool_last_dim(options.kv_dtype, cfg.mla.qk_rope_head_dim)},
                   options.kv_dtype);
        break;
      case MixerType::kGqa:
        has_attention_ = true;
        for (Tensor& pool : layer.pools)
          pool = zeroed(
              {p, ps, cfg.gqa.num_kv_heads, kv_pool_last_dim(options.kv_dtype, cfg.gqa.head_dim)},
              options.kv_dtype);
        break;
      case MixerType::kKda:
      case MixerType::kGdn:
        has_linear_ = true;
        layer.recurrent = zeroed({s, la.num_v_heads, la.head_dim, la.v_head_dim}, DType::kF32);
        layer.conv = zeroed({s, la.conv_kernel - 1, conv_channels(la)}, options.act_dtype);
        break;
    }
  }
}

const Tensor& CacheStore::pool(int layer, int which) const {
  LOOM_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()) && (which == 0 || which == 1) &&
                 layers_[layer].pools[which].defined(),
             "CacheStore::pool(%d, %d): not an attention layer", layer, which);
  return layers_[layer].pools[which];
}

Tensor CacheStore::recurrent(int layer, int64_t slot) const {
  LOOM_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()) &&
                 layers_[layer].recurrent.defined() && slot >= 0 && slot < options_.num_slots,
             "CacheStore::recurrent(%d, %lld)", layer, static_cast<long long>(slot));
  return layers_[layer].recurrent.select(slot);
}

Tensor CacheStore::conv(int layer, int64_t slot) const {
  LOOM_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()) &&
                 layers_[layer].conv.defined() && slot >= 0 && slot < options_.num_slots,
             "CacheStore::conv(%d, %lld)", layer, static_cast<long long>(slot));
  return layers_[layer].conv.select(slot);
}

const Tensor& CacheStore::recurrent_states(int layer) const {
  LOOM_CHECK(
      layer >= 0 && layer < static_cast<int>(layers_.size()) && layers_[layer].recurrent.defined(),
      "CacheStore::recurrent_states(%d): not a linear layer", layer);
  return layers_[layer].recurrent;
}

const Tensor& CacheStore::conv_states(int layer) const {
  LOOM_CHECK(
      layer >= 0 && layer < static_cast<int>(layers_.size()) && layers_[layer].conv.defined(),
      "CacheStore::conv_states(%d): not a linear layer", layer);
  return layers_[layer].conv;
}

void CacheStore::check_peer(const CacheStore& from, const char* op) const {
  LOOM_CHECK(from.layers_.size() == layers_.size() && from.options_.device == options_.device &&
                 from.options_.kv_dtype == options_.kv_dtype &&
                 from.options_.act_dtype == options_.act_dtype,
             "CacheStore::%s: the stores differ in model, device or dtypes (%s, %s)", op,
             device_name(from.options_.device).c_str(), device_name(options_.device).c_str());
}

void CacheStore::reset_slot(int64_t slot) {
  LOOM_CHECK(slot >= 0 && slot < options_.num_slots, "CacheStore::reset_slot(%lld)",
             static_cast<long long>(slot));
  for (Layer& l : layers_) {
    if (!l.recurrent.defined()) continue;
    cache_zero_slots(ex_, l.recurrent, slot, slot + 1);
    cache_zero_slots(ex_, l.conv, slot, slot + 1);
  }
}

void CacheStore::reset_page(int64_t page) {
  LOOM_CHECK(page >= 0 && page < options_.num_pages, "CacheStore::reset_page(%lld)",
             static_cast<long long>(page));
  for (Layer& l : layers_)
    for (const Tensor& pool : l.pools)
      if (pool.defined()) cache_zero_slots(ex_, pool, page, page + 1);
}

void CacheStore::copy_slot(const CacheStore& from, int64_t src, int64_t dst) {
  check_peer(from, "copy_slot");
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& a = from.layers_[l];
    Layer& b = layers_[l];
    if (!b.recurrent.defined()) continue;
    cache_copy_slot(ex_, a.recurrent, src, b.recurrent, dst);
    cache_copy_slot(ex_, a.conv, src, b.conv, dst);
  }
}

void CacheStore::copy_page_rows(const CacheStore& from, int64_t src, int64_t dst, int64_t r0,
                                int64_t r1) {
  check_peer(from, "copy_page_rows");
  for (size_t l = 0; l < layers_.size(); ++l)
    for (int w = 0; w < 2; ++w) {
      if (!layers_[l].pools[w].defined()) continue;
      cache_copy_page_rows(ex_, from.layers_[l].pools[w], src, layers_[l].pools[w], dst, r0, r1);
    }
}

}  // namespace loom

namespace loom {

size_t CacheStore::sequence_bytes(int64_t num_pages, bool slot) const {
  size_t bytes = 0;
  for (const Layer& l : layers_) {
    for (const Tensor& pool : l.pools)
      if (pool.defined()) bytes += static_cast<size_t>(num_pages) * item_bytes(pool);
    if (slot && l.recurrent.defined()) bytes += item_bytes(l.recurrent) + item_bytes(l.conv);
  }
  return bytes;
}

template <typename Fn>
void CacheStore::walk_sequence(std::span<const int32_t> pages, int64_t slot, Fn&& copy) const {
  size_t at = 0;
  for (const Layer& l : layers_) {
    for (const Tensor& pool : l.pools) {
      if (!pool.defined()) continue;
      for (int32_t p : pages) {
        LOOM_CHECK(p >= 0 && p < options_.num_pages,
                   "CacheStore: sequence page %d outside [0, %lld)", p,
                   static_cast<long long>(options_.num_pages));
        copy(item_ptr(pool, p), at, item_bytes(pool));
        at += item_bytes(pool);
      }
    }
    if (slot < 0 || !l.recurrent.defined()) continue;
    LOOM_CHECK(slot < options_.num_slots, "CacheStore: sequence slot %lld outside [0, %lld)",
               static_cast<long long>(slot), static_cast<long long>(options_.num_slots));
    for (const Tensor* pool : {&l.recurrent, &l.conv}) {
      copy(item_ptr(*pool, slot), at, item_bytes(*pool));
      at += item_bytes(*pool);
    }
  }
}

// Both directions enqueue their thousands of page and slot copies as one batch (copy_batch_async):
// one call each was ~25 us of driver time on the GPU, 0.72 s for a 128K-token session.
void CacheStore::save_sequence(std::span<const int32_t> pages, int64_t slot, void* host) const {
  char* out = static_cast<char*>(host);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  walk_sequence(pages, slot, [&](const char* item, size_t at, size_t n) {
    dsts.push_back(out + at);
    srcs.push_back(item);
    sizes.push_back(n);
  });
  copy_batch_async(ex_, dsts.data(), srcs.data(), sizes.data(), dsts.size());
}

void CacheStore::load_sequence(const void* host, std::span<const int32_t> pages, int64_t slot) {
  const char* in = static_cast<const char*>(host);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  walk_sequence(pages, slot, [&](char* item, size_t at, size_t n) {
    dsts.push_back(item);
    srcs.push_back(in + at);
    sizes.push_back(n);
  });
  copy_batch_async(ex_, dsts.data(), srcs.data(), sizes.data(), dsts.size());
}

}  // namespace loom
