#include "engine/model/host_cache_tier.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"

namespace loom {
namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'O', 'F', 'F', '1'};

// A file's header: what read_back checks before it trusts the bytes that follow.
struct FileHeader {
  char magic[8];
  uint64_t key;
  uint64_t bytes;
  uint64_t checksum;
};

// FNV-1a over 8-byte words (the tail bytewise): catches a truncated, overwritten or swapped file.
uint64_t checksum(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ULL;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::atomic<int64_t> g_instances{0};

}  // namespace

absl::StatusOr<std::unique_ptr<HostCacheTier>> HostCacheTier::create(const Options& options,
                                                                     const Exec& ex) {
  if (options.max_bytes <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("host cache tier: a budget of ", options.max_bytes, " bytes (must be > 0)"));
  if (options.max_disk_bytes < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "host cache tier: a disk budget of ", options.max_disk_bytes, " bytes (must be >= 0)"));
  const int64_t instance = g_instances.fetch_add(1);
  if (!options.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.dir, ec);
    const std::string probe =
        absl::StrCat(options.dir, "/loom-offload-", getpid(), "-", instance, "-probe");
    std::FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "wb");
    const bool written = f != nullptr && std::fwrite(kMagic, 1, 8, f) == 8;
    if (f != nullptr && std::fclose(f) != 0) ec = std::make_error_code(std::errc::io_error);
    std::remove(probe.c_str());
    if (!written || ec)
      return absl::InvalidArgumentError(
          absl::StrCat("session offload directory '", options.dir, "' cannot be written to",
                       ec ? absl::StrCat(": ", ec.message()) : std::string()));
  }
  return std::unique_ptr<HostCacheTier>(new HostCacheTier(options, ex, instance));
}

HostCacheTier::HostCacheTier(const Options& options, const Exec& ex, int64_t instance)
    : options_(options), ex_(ex), instance_(instance) {}

HostCacheTier::~HostCacheTier() {
  clear();
  reap_pending_frees(/*wait=*/true);
}

DeviceEvent HostCacheTier::mark() const {
  DeviceEvent e(ex_.device);
  e.record(ex_);
  return e;
}

void HostCacheTier::reap_pending_frees(bool wait) {
  while (!pending_frees_.empty()) {
    const PendingFree& p = pending_frees_.front();
    if (wait) {
      p.copied.wait();
    } else if (!p.copied.reached()) {
      return;  // the later ones were recorded after it on the same stream
    }
    pending_frees_.pop_front();
  }
}

bool HostCacheTier::put(uint64_t key, const Info& info, size_t bytes,
                        const std::function<void(void*)>& fill) {
  reap_pending_frees(/*wait=*/false);
  drop(key);
  Entry e;
  e.info = info;
  e.bytes = bytes;
  if (static_cast<int64_t>(bytes) > options_.max_bytes) {
    // Larger than the host tier: straight to the disk tier, through a transient buffer.
    if (options_.dir.empty() || !make_disk_room(bytes)) return false;
    e.host = allocate_transfer_buffer(bytes, ex_.device);
    fill(e.host.get());
    e.filled = mark();
    if (!spill(key, e)) return false;
    e.host.reset();
    e.tick = ++clock_;
    disk_lru_.emplace(e.tick, key);
    stats_.disk_bytes += static_cast<int64_t>(bytes);
    ++stats_.disk_entries;
    ++stats_.spilled;
  } else {
    if (!make_host_room(bytes)) return false;
    e.host = allocate_transfer_buffer(bytes, ex_.device);
    fill(e.host.get());
    e.filled = mark();
    e.tick = ++clock_;
    host_lru_.emplace(e.tick, key);
    stats_.host_bytes += static_cast<int64_t>(bytes);
    ++stats_.host_entries;
  }
  ++stats_.stored;
  entries_.emplace(key, std::move(e));
  return true;
}

std::optional<HostCacheTier::Info> HostCacheTier::hold(uint64_t key) {
  reap_pending_frees(/*wait=*/false);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  it->second.held = true;
  return it->second.info;
}

void HostCacheTier::release(uint64_t key) {
  if (auto it = entries_.find(key); it != entries_.end()) it->second.held = false;
}

bool HostCacheTier::take(uint64_t key, const std::function<void(const void*)>& read) {
  reap_pending_frees(/*wait=*/false);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  std::shared_ptr<void> blob = e.host;
  if (blob == nullptr) {  // on disk: back through a transfer buffer, checked first
    blob = allocate_transfer_buffer(e.bytes, ex_.device);
    if (!read_back(key, e, blob.get())) {
      ++stats_.lost;
      erase(it);
      return false;
    }
  }
  read(blob.get());
  // Freed once the copies out of it have finished, without waiting here for the stream.
  pending_frees_.push_back({mark(), std::move(blob)});
  ++stats_.restored;
  erase(it, /*wait_fill=*/false);  // the pending reference keeps a host blob's memory
  return true;
}

void HostCacheTier::drop(uint64_t key) {
  reap_pending_frees(/*wait=*/false);
  if (auto it = entries_.find(key); it != entries_.end()) erase(it);
}

void HostCacheTier::clear() {
  reap_pending_frees(/*wait=*/false);
  while (!entries_.empty()) erase(entries_.begin());
  evicted_keys_.clear();
}

std::string HostCacheTier::path_of(uint64_t key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? std::string() : it->second.path;
}

absl::flat_hash_map<uint64_t, HostCacheTier::Entry>::iterator HostCacheTier::oldest_unheld(
    const std::map<uint64_t, uint64_t>& lru) {
  for (const auto& [tick, key] : lru) {
    auto it = entries_.find(key);
    if (!it->second.held) return it;
  }
  return entries_.end();
}

bool HostCacheTier::make_host_room(size_t bytes) {
  while (stats_.host_bytes + static_cast<int64_t>(bytes) > options_.max_bytes) {
    auto it = oldest_unheld(host_lru_);
    if (it == entries_.end()) return false;
    Entry& e = it->second;
    const bool to_disk = !options_.dir.empty() && make_disk_room(e.bytes) && spill(it->first, e);
    if (!to_disk) {
      ++stats_.evicted;
      if (options_.report_evictions) evicted_keys_.push_back(it->first);
      erase(it);
      continue;
    }
    host_lru_.erase(e.tick);
    stats_.host_bytes -= static_cast<int64_t>(e.bytes);
    --stats_.host_entries;
    e.host.reset();
    e.tick = ++clock_;
    disk_lru_.emplace(e.tick, it->first);
    stats_.disk_bytes += static_cast<int64_t>(e.bytes);
    ++stats_.disk_entries;
    ++stats_.spilled;
  }
  return true;
}

bool HostCacheTier::make_disk_room(size_t bytes) {
  if (options_.max_disk_bytes == 0) return true;
  if (static_cast<int64_t>(bytes) > options_.max_disk_bytes) return false;
  while (stats_.disk_bytes + static_cast<int64_t>(bytes) > options_.max_disk_bytes) {
    auto it = oldest_unheld(disk_lru_);
    if (it == entries_.end()) return false;
    ++stats_.evicted;
    if (options_.report_evictions) evicted_keys_.push_back(it->first);
    erase(it);
  }
  return true;
}

bool HostCacheTier::spill(uint64_t key, Entry& e) {
  e.filled.wait();  // the blob's copies from the device have landed
  const std::string path =
      absl::StrCat(options_.dir, "/loom-offload-", getpid(), "-", instance_, "-", key, ".bin");
  FileHeader h;
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.key = key;
  h.bytes = e.bytes;
  h.checksum = checksum(e.host.get(), e.bytes);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1 &&
            (e.bytes == 0 || std::fwrite(e.host.get(), e.bytes, 1, f) == 1);
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(path.c_str());
    return false;
  }
  e.path = path;
  return true;
}

bool HostCacheTier::read_back(uint64_t key, const Entry& e, void* dst) const {
  std::FILE* f = std::fopen(e.path.c_str(), "rb");
  if (f == nullptr) return false;
  FileHeader h;
  bool ok = std::fread(&h, sizeof(h), 1, f) == 1 &&
            std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0 && h.key == key &&
            h.bytes == e.bytes && (e.bytes == 0 || std::fread(dst, e.bytes, 1, f) == 1) &&
            std::fgetc(f) == EOF;
  std::fclose(f);
  return ok && h.checksum == checksum(dst, e.bytes);
}

void HostCacheTier::erase(absl::flat_hash_map<uint64_t, Entry>::iterator it, bool wait_fill) {
  Entry& e = it->second;
  // Copies into a host blob (put's) may still be in flight, and a freed page-locked block is
  // handed to the next allocation at once (core/pinned_block_cache.h: freeing no longer waits for
  // the device, as cudaFreeHost did): wait for this blob's own copies first (usually long done).
  if (e.host != nullptr && wait_fill) e.filled.wait();
  if (e.host != nullptr) {
    host_lru_.erase(e.tick);
    stats_.host_bytes -= static_cast<int64_t>(e.bytes);
    --stats_.host_entries;
  } else {
    disk_lru_.erase(e.tick);
    stats_.disk_bytes -= static_cast<int64_t>(e.bytes);
    --stats_.disk_entries;
    std::remove(e.path.c_str());
  }
  entries_.erase(it);
}

}  // namespace loom
