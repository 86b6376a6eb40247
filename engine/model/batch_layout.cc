#include "engine/model/layers.h"

namespace loom {

CacheView BatchLayout::attention(size_t i, int layer, int which) const {
  const int64_t total = past[i] + length[i];
  if (caches[i] != nullptr) {
    LayerCache& lc = caches[i]->layer(layer);
    const Tensor& rows = which == 0 ? (lc.latent.defined() ? lc.latent : lc.key)
                                    : (lc.rope.defined() ? lc.rope : lc.value);
    return CacheView::contiguous(rows.slice(0, 0, total));
  }
  CacheView v;
  v.pool = store->pool(layer, which);
  v.pages = page_table.select(static_cast<int64_t>(i));
  v.length = total;
  return v;
}

Tensor BatchLayout::recurrent(size_t i, int layer) const {
  return caches[i] != nullptr ? caches[i]->layer(layer).recurrent
                              : store->recurrent(layer, slots[i]);
}

Tensor BatchLayout::conv(size_t i, int layer) const {
  return caches[i] != nullptr ? caches[i]->layer(layer).conv : store->conv(layer, slots[i]);
}

}  // namespace loom
