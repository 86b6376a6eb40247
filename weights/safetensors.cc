#include "weights/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// "safetensors FILE: MSG" / "safetensors FILE: tensor 'NAME': MSG".
absl::Status bad_file(std::string_view file, std::string_view msg) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors ", absl_sv(file), ": ", absl_sv(msg)));
}
absl::Status bad_tensor(std::string_view file, std::string_view tensor, std::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors ", absl_sv(file), ": tensor '",
                                                 absl_sv(tensor), "': ", absl_sv(msg)));
}

absl::Status errno_status(int err, std::string_view what, std::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(absl_sv(what), " ", absl_sv(path)));
}

// Parses JSON without exceptions and rejects duplicate object keys at any depth (nlohmann would
// silently keep one of them, making the meaning of the file ambiguous). On failure returns false
// and sets `error`.
bool parse_json_strict(const char* begin, const char* end, json* out, std::string* error) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  bool has_duplicate = false;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!keys.back().insert(k).second && !has_duplicate) {
            has_duplicate = true;
            duplicate = k;
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  *out = json::parse(begin, end, cb, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    *error = "not valid JSON";
    return false;
  }
  if (has_duplicate) {
    *error = absl::StrCat("duplicate JSON key '", duplicate, "'");
    return false;
  }
  return true;
}

// Reads a JSON integer as uint64; false for non-integers and negative values.
bool json_to_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

absl::StatusOr<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_status(errno, "cannot open", path);
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof(buf));
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes)
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than ", max_bytes, " bytes, refusing to read"));
  }
  if (in.bad()) return errno_status(errno, "cannot read", path);
  return text;
}

bool regular_file_exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::open(path);
  // MappedFile's error names the path; the prefix names the format ("safetensors PATH: not a
  // regular file", "safetensors cannot open PATH: ...").
  if (!file.ok())
    return absl::Status(file.status().code(),
                        absl::StrCat("safetensors ", file.status().message()));
  return from_mapped(*std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_bytes(std::string bytes,
                                                                             std::string name) {
  return from_mapped(MappedFile::from_bytes(std::move(bytes), std::move(name)));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_mapped(MappedFile mapped) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->file_ = std::move(mapped);
  LOOM_RETURN_IF_ERROR(file->parse());
  return file;
}

absl::Status SafetensorsFile::parse() {
  const std::string& path = file_.name();
  const char* base = file_.data();
  const size_t size = file_.size();
  if (size < 8)
    return bad_file(path, absl::StrCat("file is ", size,
                                       " bytes, shorter than the 8-byte header length field"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(base[i]);  // little endian
  if (header_len > kMaxSafetensorsHeaderBytes)
    return bad_file(path, absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                       kMaxSafetensorsHeaderBytes, " bytes"));
  if (header_len > size - 8)
    return bad_file(path, absl::StrCat("header length ", header_len, " exceeds the ", size - 8,
                                       " bytes after the length field (truncated file?)"));

  json header;
  std::string json_error;
  if (!parse_json_strict(base + 8, base + 8 + header_len, &header, &json_error))
    return bad_file(path, absl::StrCat("header: ", json_error));
  if (!header.is_object()) return bad_file(path, "header is not a JSON object");

  const uint64_t data_size = size - 8 - header_len;
  std::map<std::string, Entry, std::less<>> entries;
  std::map<std::string, std::string> metadata;

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return bad_file(path, "__metadata__ is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string())
          return bad_file(path, absl::StrCat("__metadata__ value of '", key, "' is not a string"));
        metadata[key] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) return bad_tensor(path, name, "entry is not a JSON object");

    Entry entry;
    // dtype
    const auto dt = value.find("dtype");
    if (dt == value.end()) return bad_tensor(path, name, "missing dtype");
    if (!dt->is_string()) return bad_tensor(path, name, "dtype is not a string");
    auto dtype = dtype_from_safetensors(dt->get_ref<const std::string&>());
    if (!dtype.ok()) return bad_tensor(path, name, std::string(dtype.status().message()));
    entry.dtype = *dtype;
    const uint64_t esize = dtype_size(entry.dtype);

    // shape: at most kMaxDims non-negative integers whose product (ignoring zeros) times the
    // element size fits in int64, so that numel, strides and byte sizes never overflow.
    const auto sh = value.find("shape");
    if (sh == value.end()) return bad_tensor(path, name, "missing shape");
    if (!sh->is_array()) return bad_tensor(path, name, "shape is not an array");
    if (sh->size() > static_cast<size_t>(kMaxDims))
      return bad_tensor(
          path, name, absl::StrCat("shape has ", sh->size(), " dimensions, more than ", kMaxDims));
    uint64_t nonzero_product = esize;
    bool has_zero = false;
    for (const json& d : *sh) {
      uint64_t dim = 0;
      if (!json_to_u64(d, &dim))
        return bad_tensor(path, name, "shape entries must be non-negative integers");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return bad_tensor(path, name, "shape dimension too large");
      if (dim == 0) {
        has_zero = true;
      } else if (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                 nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad_tensor(path, name, "shape element count overflows");
      }
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t nbytes = has_zero ? 0 : nonzero_product;

    // data_offsets
    const auto off = value.find("data_offsets");
    if (off == value.end()) return bad_tensor(path, name, "missing data_offsets");
    if (!off->is_array() || off->size() != 2)
      return bad_tensor(path, name, "data_offsets is not an array of two integers");
    if (!json_to_u64((*off)[0], &entry.begin) || !json_to_u64((*off)[1], &entry.end))
      return bad_tensor(path, name, "data_offsets must be non-negative integers");
    if (entry.begin > entry.end)
      return bad_tensor(path, name,
                        absl::StrCat("data_offsets begin ", entry.begin, " > end ", entry.end));
    if (entry.end > data_size)
      return bad_tensor(
          path, name,
          absl::StrCat("data_offsets end ", entry.end, " is out of range: the data section has ",
                       data_size, " bytes"));
    if (entry.end - entry.begin != nbytes)
      return bad_tensor(
          path, name,
          absl::StrCat("byte size mismatch: data_offsets span ", entry.end - entry.begin,
                       " bytes but ", absl_sv(dtype_to_safetensors(entry.dtype)),
                       entry.shape.to_string(), " needs ", nbytes));
    entries.emplace(name, entry);
  }

  // Non-empty byte ranges must not overlap (gaps are tolerated).
  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> ranges;
  ranges.reserve(entries.size());
  for (const auto& [name, e] : entries)
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end, &name);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [pb, pe, pname] = ranges[i - 1];
    const auto& [cb, ce, cname] = ranges[i];
    if (cb < pe)
      return bad_tensor(path, *cname,
                        absl::StrCat("data range [", cb, ", ", ce, ") overlaps tensor '", *pname,
                                     "' at [", pb, ", ", pe, ")"));
  }

  data_ = base + 8 + header_len;
  entries_ = std::move(entries);
  metadata_ = std::move(metadata);
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

const SafetensorsFile::Entry* SafetensorsFile::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<Tensor> SafetensorsFile::get(std::string_view name) const {
  const Entry* e = find(name);
  if (e == nullptr)
    return absl::NotFoundError(
        absl::StrCat("safetensors ", path(), ": no tensor '", absl_sv(name), "'"));
  const char* ptr = data_ + e->begin;
  const size_t esize = dtype_size(e->dtype);
  // The official writer pads the header so that the data section starts 8-byte aligned, and
  // offsets are multiples of the element size, so views are normally aligned. A file from another
  // writer may not be: then return an aligned copy so consumers can rely on element alignment.
  // The mapping is read-only (PROT_READ): views must not be written to.
  if (reinterpret_cast<uintptr_t>(ptr) % esize != 0) {
    Tensor copy = Tensor::empty(e->shape, e->dtype, Device::kCpu);
    std::memcpy(copy.raw(), ptr, e->end - e->begin);
    return copy;
  }
  return Tensor::wrap(const_cast<char*>(ptr), e->shape, e->dtype, Device::kCpu,
                      std::const_pointer_cast<void>(file_.owner()));
}

// ---------------------------------------------------------------------------------------------
// Writing

absl::Status write_safetensors(const std::string& path,
                               const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<Tensor> packed;
  packed.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return absl::InvalidArgumentError(
          absl::StrCat("write_safetensors ", path, ": '__metadata__' is reserved"));
    if (header.contains(name))
      return absl::InvalidArgumentError(
          absl::StrCat("write_safetensors ", path, ": duplicate tensor name '", name, "'"));
    if (t.device() != Device::kCpu)
      return absl::InvalidArgumentError(absl::StrCat("write_safetensors ", path, ": tensor '", name,
                                                     "' is not on the host (", t.describe(), ")"));
    if (t.raw() == nullptr && t.numel() > 0)
      return absl::InvalidArgumentError(
          absl::StrCat("write_safetensors ", path, ": tensor '", name, "' is undefined"));
    Tensor c = t.is_contiguous() ? t : t.clone();
    const uint64_t nbytes = c.nbytes();
    ordered_json entry = ordered_json::object();
    entry["dtype"] = std::string(dtype_to_safetensors(c.dtype()));
    ordered_json shape = ordered_json::array();
    for (int64_t d : c.shape()) shape.push_back(d);
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = ordered_json::array({offset, offset + nbytes});
    header[name] = std::move(entry);
    offset += nbytes;
    packed.push_back(std::move(c));
  }

  std::string text;
  try {
    text = header.dump();  // throws on names or metadata that are not valid UTF-8
  } catch (const nlohmann::json::exception& ex) {
    return absl::InvalidArgumentError(
        absl::StrCat("write_safetensors ", path, ": cannot encode header: ", ex.what()));
  }
  // Like the official writer: pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat("write_safetensors ", path, ": header of ",
                                                   text.size(), " bytes is too large"));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot create", tmp);
  auto write_all = [fd](const void* p, size_t n) -> int {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
    return 0;
  };
  auto fail = [&](int err, std::string_view what) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status(err, what, tmp);
  };
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (int err = write_all(len, 8)) return fail(err, "cannot write");
  if (int err = write_all(text.data(), text.size())) return fail(err, "cannot write");
  for (const Tensor& t : packed)
    if (t.nbytes() > 0)
      if (int err = write_all(t.raw(), t.nbytes())) return fail(err, "cannot write");
  if (::fsync(fd) != 0) return fail(errno, "cannot fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_status(err, "cannot close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_status(err, absl::StrCat("cannot rename ", tmp, " to"), path);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

absl::StatusOr<Checkpoint> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir, ": not a directory"));

  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);

  // Adds every tensor of files_[i] to index_, rejecting names already provided by another file.
  auto add_all = [&ck](size_t i) -> absl::Status {
    for (const std::string& name : ck.files_[i]->names()) {
      auto [it, inserted] = ck.index_.emplace(name, i);
      if (!inserted && it->second != i)
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint ", ck.dir_, ": tensor '", name, "' appears in both ",
                         ck.files_[it->second]->path(), " and ", ck.files_[i]->path()));
    }
    return absl::OkStatus();
  };

  if (regular_file_exists(root / "model.safetensors")) {
    LOOM_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open((root / "model.safetensors").string()));
    ck.files_.push_back(std::move(f));
    LOOM_RETURN_IF_ERROR(add_all(0));
    return ck;
  }

  const fs::path index_path = root / "model.safetensors.index.json";
  if (regular_file_exists(index_path)) {
    const std::string ip = index_path.string();
    LOOM_ASSIGN_OR_RETURN(std::string text, read_small_file(ip, kMaxSafetensorsHeaderBytes));
    json index;
    std::string json_error;
    if (!parse_json_strict(text.data(), text.data() + text.size(), &index, &json_error))
      return absl::InvalidArgumentError(absl::StrCat(ip, ": ", json_error));
    if (!index.is_object())
      return absl::InvalidArgumentError(absl::StrCat(ip, ": not a JSON object"));
    const auto wm = index.find("weight_map");
    if (wm == index.end())
      return absl::InvalidArgumentError(absl::StrCat(ip, ": missing weight_map"));
    if (!wm->is_object())
      return absl::InvalidArgumentError(absl::StrCat(ip, ": weight_map is not a JSON object"));
    if (wm->empty()) return absl::InvalidArgumentError(absl::StrCat(ip, ": weight_map is empty"));

    std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
    std::vector<std::pair<std::string, size_t>> listed;
    for (const auto& [name, v] : wm->items()) {
      if (!v.is_string())
        return absl::InvalidArgumentError(
            absl::StrCat(ip, ": weight_map entry for '", name, "' is not a string"));
      const std::string& shard = v.get_ref<const std::string&>();
      const fs::path sp(shard);
      bool escapes = shard.empty() || sp.is_absolute();
      for (const auto& part : sp)
        if (part == "..") escapes = true;
      if (escapes)
        return absl::InvalidArgumentError(
            absl::StrCat(ip, ": weight_map entry for '", name, "' names shard '", shard,
                         "', which is not a relative path inside the checkpoint directory"));
      auto it = shard_index.find(shard);
      if (it == shard_index.end()) {
        auto f = SafetensorsFile::open((root / sp).string());
        if (!f.ok())
          return absl::Status(f.status().code(),
                              absl::StrCat(ip, ": shard '", shard, "' (listed for tensor '", name,
                                           "'): ", f.status().message()));
        ck.files_.push_back(std::move(*f));
        it = shard_index.emplace(shard, ck.files_.size() - 1).first;
      }
      if (!ck.files_[it->second]->contains(name))
        return absl::InvalidArgumentError(absl::StrCat(ip, ": tensor '", name,
                                                       "' is listed in shard '", shard,
                                                       "', which does not contain it"));
      listed.emplace_back(name, it->second);
    }
    // Index entries first (they are authoritative), then every shard's full contents so that a
    // tensor stored in two shards is reported even when the index names only one of them.
    for (const auto& [name, i] : listed) ck.index_.emplace(name, i);
    for (size_t i = 0; i < ck.files_.size(); ++i) LOOM_RETURN_IF_ERROR(add_all(i));
    return ck;
  }

  std::vector<std::string> shards;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.extension() == ".safetensors" && regular_file_exists(p)) shards.push_back(p.string());
  }
  if (ec) return errno_status(ec.value(), "cannot list", dir);
  if (shards.empty())
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir,
                     ": no model.safetensors, model.safetensors.index.json or *.safetensors file"));
  std::sort(shards.begin(), shards.end());
  for (const std::string& s : shards) {
    LOOM_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(s));
    ck.files_.push_back(std::move(f));
    LOOM_RETURN_IF_ERROR(add_all(ck.files_.size() - 1));
  }
  return ck;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, i] : index_) out.push_back(name);
  return out;
}

bool Checkpoint::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

const SafetensorsFile::Entry* Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : files_[it->second]->find(name);
}

absl::StatusOr<Tensor> Checkpoint::get(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", dir_, ": no tensor '", absl_sv(name), "'"));
  return files_[it->second]->get(name);
}

}  // namespace loom
