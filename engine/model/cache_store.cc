#include "engine/model/cache_store.h"

#include <cstring>

#include "core/status.h"

namespace loom {
namespace {

int64_t conv_channels(const LinearAttentionConfig& la) {
  return 2LL * la.num_heads * la.head_dim + static_cast<int64_t>(la.num_v_heads) * la.v_head_dim;
}

bool is_linear(MixerType m) { return m == MixerType::kKda || m == MixerType::kGdn; }

}  // namespace

size_t CacheStore::page_bytes(const ModelConfig& cfg, int64_t page_size) {
  size_t floats = 0;
  for (MixerType m : cfg.mixers) {
    if (m == MixerType::kMla) floats += cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim;
    if (m == MixerType::kGqa)
      floats += 2 * static_cast<size_t>(cfg.gqa.num_kv_heads) * cfg.gqa.head_dim;
  }
  return floats * sizeof(float) * static_cast<size_t>(page_size);
}

size_t CacheStore::slot_bytes(const ModelConfig& cfg) {
  const LinearAttentionConfig& la = cfg.linear;
  size_t floats = 0;
  for (MixerType m : cfg.mixers)
    if (is_linear(m))
      floats += static_cast<size_t>(la.num_v_heads) * la.head_dim * la.v_head_dim +
                static_cast<size_t>(la.conv_kernel - 1) * conv_channels(la);
  return floats * sizeof(float);
}

CacheStore::CacheStore(const ModelConfig& cfg, const Options& options) : options_(options) {
  LOOM_CHECK(options.page_size > 0 && options.num_pages >= 0 && options.num_slots >= 0,
             "CacheStore: bad options");
  layers_.resize(cfg.num_layers);
  const LinearAttentionConfig& la = cfg.linear;
  for (int l = 0; l < cfg.num_layers; ++l) {
    Layer& layer = layers_[l];
    const int64_t p = options.num_pages, ps = options.page_size, s = options.num_slots;
    switch (cfg.mixers[l]) {
      case MixerType::kMla:
        has_attention_ = true;
        layer.pools[0] = Tensor::zeros({p, ps, cfg.mla.kv_lora_rank});
        layer.pools[1] = Tensor::zeros({p, ps, cfg.mla.qk_rope_head_dim});
        break;
      case MixerType::kGqa:
        has_attention_ = true;
        layer.pools[0] = Tensor::zeros({p, ps, cfg.gqa.num_kv_heads, cfg.gqa.head_dim});
        layer.pools[1] = Tensor::zeros({p, ps, cfg.gqa.num_kv_heads, cfg.gqa.head_dim});
        break;
      case MixerType::kKda:
      case MixerType::kGdn:
        has_linear_ = true;
        layer.recurrent = Tensor::zeros({s, la.num_v_heads, la.head_dim, la.v_head_dim});
        layer.conv = Tensor::zeros({s, la.conv_kernel - 1, conv_channels(la)});
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

void CacheStore::reset_slot(int64_t slot) {
  for (Layer& l : layers_) {
    if (!l.recurrent.defined()) continue;
    std::memset(l.recurrent.select(slot).raw(), 0, l.recurrent.select(slot).nbytes());
    std::memset(l.conv.select(slot).raw(), 0, l.conv.select(slot).nbytes());
  }
}

void CacheStore::copy_slot(const CacheStore& from, int64_t src, int64_t dst) {
  LOOM_CHECK(src >= 0 && src < from.options_.num_slots && dst >= 0 && dst < options_.num_slots &&
                 from.layers_.size() == layers_.size(),
             "CacheStore::copy_slot(%lld, %lld)", static_cast<long long>(src),
             static_cast<long long>(dst));
  if (&from == this && src == dst) return;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& a = from.layers_[l];
    Layer& b = layers_[l];
    if (!b.recurrent.defined()) continue;
    b.recurrent.select(dst).copy_from(a.recurrent.select(src));
    b.conv.select(dst).copy_from(a.conv.select(src));
  }
}

void CacheStore::copy_page_rows(const CacheStore& from, int64_t src, int64_t dst, int64_t r0,
                                int64_t r1) {
  LOOM_CHECK(from.layers_.size() == layers_.size() && 0 <= r0 && r0 <= r1 &&
                 (r0 == r1 || (src >= 0 && src < from.num_pages() && dst >= 0 &&
                               dst < num_pages() && r1 <= from.page_size() && r1 <= page_size())),
             "CacheStore::copy_page_rows(page %lld -> %lld, rows [%lld, %lld))",
             static_cast<long long>(src), static_cast<long long>(dst), static_cast<long long>(r0),
             static_cast<long long>(r1));
  if (r0 == r1 || (&from == this && src == dst)) return;
  for (size_t l = 0; l < layers_.size(); ++l)
    for (int w = 0; w < 2; ++w) {
      if (!layers_[l].pools[w].defined()) continue;
      layers_[l].pools[w].select(dst).slice(0, r0, r1).copy_from(
          from.layers_[l].pools[w].select(src).slice(0, r0, r1));
    }
}

}  // namespace loom
