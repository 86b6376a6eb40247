// Reference-counted pools of int32 ids: KV cache pages and linear-attention state slots. The pool
// hands out ids only; what the bytes behind an id mean belongs to the model (STYLE habit 2).
//
// Ownership: every reference to an id is an `IdPool::Handle` (move-only RAII). `Handle::share()`
// adds a reference; destroying or `reset()`ing a handle drops one. `IdPool::release()` is the one
// place that decrements a count and the one place that returns an id to the free list.
//
// Thread-safety: none. A pool and all its handles belong to the engine loop thread.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

class IdPool {
 public:
  // A counted reference to one id, or empty (id() == -1). REQUIRES: the pool outlives the handle.
  class Handle {
   public:
    Handle() = default;
    Handle(Handle&& other) noexcept : pool_(other.pool_), id_(other.id_) { other.pool_ = nullptr; }
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { reset(); }

    bool valid() const { return pool_ != nullptr; }
    int32_t id() const { return pool_ ? id_ : -1; }
    // Another reference to the same id (empty if this one is empty).
    Handle share() const;
    // Drops this reference; the id is freed when it was the last one.
    void reset();
    // References to this id across all handles (0 when empty).
    int32_t use_count() const;

   private:
    friend class IdPool;
    Handle(IdPool* pool, int32_t id) : pool_(pool), id_(id) {}
    IdPool* pool_ = nullptr;
    int32_t id_ = -1;
  };

  // Ids [first_id, first_id + count) are handed out; ids below first_id are reserved.
  IdPool(int32_t count, int32_t first_id);
  IdPool(const IdPool&) = delete;
  IdPool& operator=(const IdPool&) = delete;
  // REQUIRES: no handle outlives the pool (checked).
  ~IdPool();

  // All-or-nothing: appends `n` fresh handles (count 1 each) to `out` and returns true, or returns
  // false and leaves `out` untouched when fewer than `n` ids are free. Lowest free ids first.
  bool allocate(int32_t n, std::vector<Handle>* out);
  // One fresh handle, or an empty one when none is free.
  Handle allocate_one();

  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t capacity() const { return static_cast<int32_t>(refs_.size()); }
  int32_t first_id() const { return first_id_; }
  int32_t end_id() const { return first_id_ + capacity(); }
  // Current reference count of `id` (0 when free). REQUIRES: first_id() <= id < end_id().
  int32_t ref_count(int32_t id) const;

 private:
  void retain(int32_t id);
  void release(int32_t id);  // the one decrement, the one free

  int32_t first_id_;
  std::vector<int32_t> refs_;  // indexed by id - first_id_
  std::vector<int32_t> free_;  // stack; back() is the next id handed out
};

// KV cache pages of `page_size` tokens each. One page id indexes the same page in every attention
// layer's cache. The engine's pools have `num_pages` pages; page 0 (kScratchPage) is never handed
// out: padded entries of a step's page table (and padded batch rows of a CUDA graph) point at it,
// so they can never read or write a live request's rows. capacity() == max(num_pages - 1, 0).
class KvPagePool : public IdPool {
 public:
  static constexpr int32_t kScratchPage = 0;
  KvPagePool(int32_t num_pages, int32_t page_size);
  int32_t page_size() const { return page_size_; }
  // Pages covering `num_tokens` positions (ceil).
  int32_t pages_for_tokens(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + page_size_ - 1) / page_size_);
  }

 private:
  int32_t page_size_;
};

// Linear-attention state slots. The engine's state buffer has `num_slots` slots; slot 0
// (kScratchSlot) is never handed out: padded batch entries (CUDA graphs) point at it so they can
// never write a live request's state (vLLM #28436). capacity() == max(num_slots - 1, 0).
class StateSlotPool : public IdPool {
 public:
  static constexpr int32_t kScratchSlot = 0;
  explicit StateSlotPool(int32_t num_slots);
};

}  // namespace loom
