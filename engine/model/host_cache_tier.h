// HostCacheTier: byte blobs of offloaded sequence caches (engine/session_offload.h) in host
// memory under a byte budget, and optionally in files of a directory below it. It knows nothing
// of what the bytes mean: CacheStore packs and unpacks them.
//
// put() stores a blob, making room by moving the least recently stored blobs that are not held
// to the disk tier (or dropping them without one, or when the disk budget or a write fails); a
// blob larger than the host budget goes to the disk tier directly;
// take() hands a blob back once and forgets it. A blob read back from disk is checked (header,
// size, checksum): a missing, short or corrupt file is reported as lost, never returned. Host
// blobs are allocated per entry (allocate_transfer_buffer: page-locked for a GPU peer), so an
// empty tier holds no memory whatever its budget.
//
// Copies into a blob may still be in flight on `ex`'s stream when put() returns, and copies out of
// it when take() returns. The tier never waits for the whole stream (which would hold the engine
// loop until the step in flight ends): each blob carries a device event recorded after its fill,
// waited for only before the tier reads the blob itself (to write it to disk) or frees it from a
// drop or an eviction (usually long reached); a taken blob is freed once the event recorded after
// its reader's copies is reached (checked in order at every put, hold, take, drop and clear;
// waited for at destruction). Taken blobs waiting for their copies are page-locked memory outside
// the budget, for about a step.
//
// Thread-safety: none; owned by the engine loop thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/device_event.h"
#include "kernels/exec.h"

namespace loom {

class HostCacheTier {
 public:
  struct Options {
    int64_t max_bytes = 0;       // host memory for blobs; > 0
    std::string dir;             // empty: no disk tier
    int64_t max_disk_bytes = 0;  // the disk tier's blobs (file headers not counted); 0: no limit
    // Keep the keys of blobs the budgets drop, for take_evicted(): an owner that indexes its blobs
    // (the prefix cache) forgets them. Off: nothing is kept (an owner that only looks keys up).
    bool report_evictions = false;
  };
  // What a blob's owner needs to know to take it back (the tier only keeps it).
  struct Info {
    int32_t num_computed = 0;
    int32_t num_pages = 0;
    bool has_slot = false;
  };
  struct Stats {
    int32_t host_entries = 0, disk_entries = 0;
    int64_t host_bytes = 0, disk_bytes = 0;
    int64_t stored = 0;    // put() calls that kept their blob
    int64_t restored = 0;  // take() calls that handed a blob back
    int64_t spilled = 0;   // blobs moved from host memory to disk
    int64_t evicted = 0;   // blobs dropped by the budgets (or a failed write)
    int64_t lost = 0;      // blobs whose file was missing or corrupt at take()
  };

  // InvalidArgument for a budget <= 0 or a directory that cannot be created or written to.
  // `ex`: the stream blob copies are enqueued on (host_exec() for the CPU); its device decides
  // whether host blobs are page-locked.
  static absl::StatusOr<std::unique_ptr<HostCacheTier>> create(const Options& options,
                                                               const Exec& ex);
  ~HostCacheTier();  // removes its files
  HostCacheTier(const HostCacheTier&) = delete;
  HostCacheTier& operator=(const HostCacheTier&) = delete;

  // Stores `bytes` under `key` (replacing what was there): `fill(dst)` writes (or enqueues copies
  // of) them into a fresh host blob. False when the blob cannot be kept: larger than the host
  // budget without a disk tier that takes it, or no room once every unheld blob is moved out
  // (`fill` is not called then), or a failed write to disk.
  bool put(uint64_t key, const Info& info, size_t bytes, const std::function<void(void*)>& fill);
  // The blob under `key`, if any, now kept from eviction until take(), release() or drop().
  std::optional<Info> hold(uint64_t key);
  void release(uint64_t key);
  // Hands the blob under `key` to `read(src)` (which may enqueue copies out of it), then forgets
  // it. False when there is none, or its file is missing or corrupt (forgotten too; `read` not
  // called).
  bool take(uint64_t key, const std::function<void(const void*)>& read);
  void drop(uint64_t key);
  void clear();
  bool contains(uint64_t key) const { return entries_.contains(key); }
  // The keys of the blobs the budgets dropped (Stats::evicted) since the last call, with
  // Options::report_evictions; empty without.
  std::vector<uint64_t> take_evicted() { return std::exchange(evicted_keys_, {}); }

  const Stats& stats() const { return stats_; }
  // The file a blob on disk is kept in (tests corrupt it); empty when it is in host memory.
  std::string path_of(uint64_t key) const;

 private:
  struct Entry {
    Info info;
    size_t bytes = 0;
    std::shared_ptr<void> host;  // null once on disk
    std::string path;            // the file, once on disk
    uint64_t tick = 0;           // its place in its tier's LRU order
    bool held = false;
    DeviceEvent filled;  // reached once put's copies into `host` have landed (empty on the CPU)
  };
  // A blob whose copies out (take's reader) may be in flight: freed once `copied` is reached.
  struct PendingFree {
    DeviceEvent copied;
    std::shared_ptr<void> blob;
  };
  // An event recorded on ex_'s stream now (empty on the CPU).
  DeviceEvent mark() const;
  // Frees the pending blobs whose copies have finished (in the order they were taken: their events
  // are on one stream, so they are reached in that order); with `wait`, all of them, waiting.
  void reap_pending_frees(bool wait);
  HostCacheTier(const Options& options, const Exec& ex, int64_t instance);
  // Moves unheld host blobs out (least recent first) until `bytes` more fit. False if they do not.
  bool make_host_room(size_t bytes);
  // Frees disk room for `bytes` more (least recent unheld files first). False if it cannot.
  bool make_disk_room(size_t bytes);
  // Writes a host blob to its file (false on a failed write: the caller drops it).
  bool spill(uint64_t key, Entry& e);
  bool read_back(uint64_t key, const Entry& e, void* dst) const;
  // `wait_fill`: wait for put's copies into a host blob before it is freed (take's caller keeps
  // the blob alive itself, on the pending list).
  void erase(absl::flat_hash_map<uint64_t, Entry>::iterator it, bool wait_fill = true);
  // The least recently used unheld entry of one tier's order, or entries_.end().
  absl::flat_hash_map<uint64_t, Entry>::iterator oldest_unheld(
      const std::map<uint64_t, uint64_t>& lru);

  const Options options_;
  const Exec ex_;
  const int64_t instance_;  // tells apart the files of several tiers in one process
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::map<uint64_t, uint64_t> host_lru_, disk_lru_;  // tick -> key, oldest first
  uint64_t clock_ = 0;
  Stats stats_;
  std::vector<uint64_t> evicted_keys_;  // with Options::report_evictions, until take_evicted()
  std::deque<PendingFree> pending_frees_;
};

}  // namespace loom
