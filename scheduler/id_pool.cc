#include "scheduler/id_pool.h"

#include <algorithm>
#include <string>

#include "core/status.h"

namespace loom {

IdPool::Handle& IdPool::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = other.pool_;
    id_ = other.id_;
    other.pool_ = nullptr;
  }
  return *this;
}

IdPool::Handle IdPool::Handle::share() const {
  if (!pool_) return Handle();
  pool_->retain(id_);
  return Handle(pool_, id_);
}

void IdPool::Handle::reset() {
  if (!pool_) return;
  IdPool* pool = pool_;
  pool_ = nullptr;
  pool->release(id_);
}

int32_t IdPool::Handle::use_count() const { return pool_ ? pool_->ref_count(id_) : 0; }

IdPool::IdPool(int32_t count, int32_t first_id) : first_id_(first_id) {
  LOOM_CHECK(count >= 0 && first_id >= 0, "count %d first_id %d", count, first_id);
  refs_.assign(count, 0);
  free_.reserve(count);
  for (int32_t i = count - 1; i >= 0; --i) free_.push_back(first_id + i);
}

IdPool::~IdPool() {
  LOOM_CHECK(free_count() == capacity(), "%d ids still referenced when the pool is destroyed",
             capacity() - free_count());
}

bool IdPool::allocate(int32_t n, std::vector<Handle>* out) {
  LOOM_CHECK(n >= 0, "n %d", n);
  if (n > free_count()) return false;
  out->reserve(out->size() + n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    refs_[id - first_id_] = 1;
    out->push_back(Handle(this, id));
  }
  return true;
}

IdPool::Handle IdPool::allocate_one() {
  if (free_.empty()) return Handle();
  const int32_t id = free_.back();
  free_.pop_back();
  refs_[id - first_id_] = 1;
  return Handle(this, id);
}

int32_t IdPool::ref_count(int32_t id) const {
  LOOM_CHECK(id >= first_id_ && id < end_id(), "id %d outside [%d, %d)", id, first_id_, end_id());
  return refs_[id - first_id_];
}

void IdPool::retain(int32_t id) {
  int32_t& r = refs_[id - first_id_];
  LOOM_CHECK(r > 0, "retain of free id %d", id);
  ++r;
}

void IdPool::release(int32_t id) {
  LOOM_CHECK(id >= first_id_ && id < end_id(), "id %d outside [%d, %d)", id, first_id_, end_id());
  int32_t& r = refs_[id - first_id_];
  LOOM_CHECK(r > 0, "double release of id %d", id);
  if (--r == 0) free_.push_back(id);
}

KvPagePool::KvPagePool(int32_t num_pages, int32_t page_size)
    : IdPool(std::max(num_pages - 1, 0), kScratchPage + 1), page_size_(page_size) {
  LOOM_CHECK(page_size > 0, "page_size %d", page_size);
}

StateSlotPool::StateSlotPool(int32_t num_slots)
    : IdPool(std::max(num_slots - 1, 0), kScratchSlot + 1) {}

}  // namespace loom
