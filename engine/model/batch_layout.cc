#include "engine/model/layers.h"

namespace loom {

CacheView BatchLayout::attention(size_t i, int layer, int which) const {
  CacheView v;
  v.pool = store->pool(layer, which);
  v.pages = page_table.select(static_cast<int64_t>(i));
  v.length = past[i] + length[i];
  return v;
}

}  // namespace loom
