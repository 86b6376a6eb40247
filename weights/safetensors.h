// safetensors: reading (memory-mapped, zero-copy views) and writing.
//
// Format: 8-byte little-endian header length N, N bytes of JSON mapping tensor names to
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the byte after the header),
// an optional "__metadata__" map of strings, then the data. Every malformed input is reported as an
// InvalidArgumentError naming the file and tensor; nothing here aborts on bad bytes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace loom {

// Largest header accepted (the format's own readers use 100 MB); protects against a hostile
// length field making us parse or allocate gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

class SafetensorsFile {
 public:
  struct Entry {
    DType dtype;
    Shape shape;
    uint64_t begin = 0;  // byte offsets into the data section
    uint64_t end = 0;
  };

  // Maps `path` read-only. The mapping lives as long as the file object or any Tensor from get().
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses an in-memory image (tests, fuzzing). `name` is used in error messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> from_bytes(std::string bytes,
                                                                     std::string name = "<memory>");

  const std::string& path() const { return file_.name(); }
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  const Entry* find(std::string_view name) const;  // null when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A zero-copy host view of the tensor in the file's own dtype. NotFoundError when absent.
  absl::StatusOr<Tensor> get(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> from_mapped(MappedFile file);
  absl::Status parse();  // of file_

  MappedFile file_;             // the bytes (tensors from get() share their ownership)
  const char* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes host tensors (any supported dtype; non-contiguous views are packed) in the given order.
absl::Status write_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// A checkpoint directory: `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"weight_map": {name: file}}), or, failing both, every
// `*.safetensors` file in the directory. Tensor names must be unique across shards.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> open(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  const SafetensorsFile::Entry* find(std::string_view name) const;
  absl::StatusOr<Tensor> get(std::string_view name) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> index_;  // tensor name -> files_ index
};

}  // namespace loom
