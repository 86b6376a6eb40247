#include "engine/model/sequence_cache.h"

#include <algorithm>
#include <cstring>

namespace loom {

SequenceCache::SequenceCache(const ModelConfig& cfg) : mixers_(cfg.mixers) {
  layers_.resize(cfg.num_layers);
  const auto& la = cfg.linear;
  for (int i = 0; i < cfg.num_layers; ++i) {
    LayerCache& lc = layers_[i];
    switch (cfg.mixers[i]) {
      case MixerType::kKda:
      case MixerType::kGdn: {
        const int64_t conv_channels =
            2LL * la.num_heads * la.head_dim + static_cast<int64_t>(la.num_v_heads) * la.v_head_dim;
        lc.recurrent = Tensor::zeros({la.num_v_heads, la.head_dim, la.v_head_dim});
        lc.conv = Tensor::zeros({la.conv_kernel - 1, conv_channels});
        break;
      }
      case MixerType::kMla:
        lc.latent = Tensor::zeros({0, cfg.mla.kv_lora_rank});
        lc.rope = Tensor::zeros({0, cfg.mla.qk_rope_head_dim});
        break;
      case MixerType::kGqa:
        lc.key = Tensor::zeros({0, cfg.gqa.num_kv_heads, cfg.gqa.head_dim});
        lc.value = Tensor::zeros({0, cfg.gqa.num_kv_heads, cfg.gqa.head_dim});
        break;
    }
  }
}

void SequenceCache::reserve(int64_t n) {
  const int64_t need = num_tokens_ + n;
  if (need <= capacity_) return;
  const int64_t cap = std::max<int64_t>({need, 2 * capacity_, 64});
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (mixers_[i] != MixerType::kMla && mixers_[i] != MixerType::kGqa) continue;
    LayerCache& lc = layers_[i];
    for (Tensor* t : {&lc.latent, &lc.rope, &lc.key, &lc.value}) {
      if (!t->defined()) continue;
      Shape shape = t->shape();
      shape[0] = cap;
      Tensor grown = Tensor::zeros(shape);
      if (num_tokens_ > 0) grown.slice(0, 0, num_tokens_).copy_from(t->slice(0, 0, num_tokens_));
      *t = grown;
    }
  }
  capacity_ = cap;
}

size_t SequenceCache::nbytes() const {
  size_t n = 0;
  for (const LayerCache& lc : layers_)
    for (const Tensor* t : {&lc.recurrent, &lc.conv, &lc.latent, &lc.rope, &lc.key, &lc.value})
      if (t->defined()) n += t->nbytes();
  return n;
}

}  // namespace loom
