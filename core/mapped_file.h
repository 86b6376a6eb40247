// A read-only view of a whole file (mmap on POSIX), or of bytes held in memory, behind one
// type: parsers take a MappedFile and need not care which (fuzzers and tests pass bytes).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace loom {

class MappedFile {
 public:
  // Maps `path` read-only. NotFound / PermissionDenied / InvalidArgument (not a regular file)
  // name the path.
  static absl::StatusOr<MappedFile> open(const std::string& path);
  // Holds `bytes` in memory under the name `name` (used in error messages).
  static MappedFile from_bytes(std::string bytes, std::string name);

  const char* data() const { return static_cast<const char*>(base_.get()); }
  size_t size() const { return size_; }
  std::string_view bytes() const { return {data(), size_}; }
  const std::string& name() const { return name_; }
  // Shares ownership of the bytes (tensors that view the file keep it alive).
  const std::shared_ptr<const void>& owner() const { return base_; }

 private:
  std::shared_ptr<const void> base_;
  size_t size_ = 0;
  std::string name_;
};

}  // namespace loom
