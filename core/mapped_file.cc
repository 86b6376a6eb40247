#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {
namespace {

absl::Status errno_status(int err, std::string_view what, const std::string& path) {
  const std::string msg = absl::StrCat(absl_sv(what), " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InvalidArgumentError(msg);
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile f;
  f.name_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ == 0) {
    ::close(fd);
    f.base_ = std::make_shared<const char>('\0');  // an empty file maps nothing
    return f;
  }
  void* base = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid after close
  if (base == MAP_FAILED) return errno_status(err, "cannot mmap", path);
  const size_t size = f.size_;
  f.base_ = std::shared_ptr<const void>(
      base, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return f;
}

MappedFile MappedFile::from_bytes(std::string bytes, std::string name) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  MappedFile f;
  f.name_ = std::move(name);
  f.size_ = owned->size();
  // Aliasing constructor: the pointer is the bytes, the ownership is the string.
  f.base_ = std::shared_ptr<const void>(owned, owned->data());
  return f;
}

}  // namespace loom
