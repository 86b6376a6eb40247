#include "engine/model/sequence_cache.h"

#include <algorithm>

namespace loom {
namespace {

CacheStore::Options one_sequence(int64_t capacity, Device device, DType act_dtype) {
  // No page until the first reserve: a new cache holds only its (zero) linear states.
  return {.num_pages = capacity > 0 ? 1 : 0,
          .page_size = std::max<int64_t>(capacity, 1),
          .num_slots = 1,
          .device = device,
          .act_dtype = act_dtype};
}

}  // namespace

SequenceCache::SequenceCache(const ModelConfig& cfg, Device device, DType act_dtype)
    : cfg_(cfg), store_(cfg, one_sequence(0, device, act_dtype)) {}

void SequenceCache::reserve(int64_t n) {
  const int64_t need = num_tokens_ + n;
  if (!store_.has_attention() || need <= capacity_) return;
  const int64_t cap = std::max<int64_t>({need, 2 * capacity_, 64});
  CacheStore grown(cfg_, one_sequence(cap, store_.device(), store_.act_dtype()));
  grown.copy_slot(store_, 0, 0);
  grown.copy_page_rows(store_, 0, 0, 0, num_tokens_);
  store_ = std::move(grown);
  capacity_ = cap;
}

size_t SequenceCache::nbytes() const {
  return (capacity_ > 0 ? CacheStore::page_bytes(cfg_, capacity_) : 0) +
         CacheStore::slot_bytes(cfg_, store_.act_dtype());
}

}  // namespace loom
