#include "trainer/token_shard.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {
namespace {

uint64_t load_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t load_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
void store(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::Status bad(const std::string& name, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("token shard ", name, ": ", absl_sv(why)));
}

}  // namespace

absl::StatusOr<TokenShard> TokenShard::open(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  return parse(std::move(file));
}

absl::StatusOr<TokenShard> TokenShard::parse(MappedFile file) {
  const char* p = file.data();
  const size_t size = file.size();
  const std::string& name = file.name();
  if (size < kTokenShardHeaderBytes)
    return bad(name, absl::StrCat(size, " bytes, shorter than the ", kTokenShardHeaderBytes,
                                  "-byte header"));
  if (std::memcmp(p, kTokenShardMagic, 8) != 0) return bad(name, "not a token shard (magic)");
  const uint32_t version = load_u32(p + 8);
  if (version != kTokenShardVersion)
    return bad(name, absl::StrCat("version ", version, ", this build reads ", kTokenShardVersion));
  const uint32_t width = load_u32(p + 12);
  if (width != 2 && width != 4)
    return bad(name, absl::StrCat("token width ", width, " bytes (2 or 4)"));
  const uint64_t docs = load_u64(p + 16), tokens = load_u64(p + 24);
  // Bound the counts by the file size before multiplying, so no product overflows.
  if (docs >= size / 8 || tokens > size / width)
    return bad(name, absl::StrCat(docs, " documents and ", tokens, " tokens cannot fit in ", size,
                                  " bytes"));
  const uint64_t want = kTokenShardHeaderBytes + 8 * (docs + 1) + width * tokens;
  if (want != size)
    return bad(name, absl::StrCat("the header implies ", want, " bytes, the file has ", size));
  TokenShard s;
  s.num_docs_ = static_cast<int64_t>(docs);
  s.num_tokens_ = static_cast<int64_t>(tokens);
  s.token_bytes_ = static_cast<int>(width);
  s.offsets_ = p + kTokenShardHeaderBytes;
  s.tokens_ = s.offsets_ + 8 * (docs + 1);
  uint64_t prev = 0;
  for (uint64_t d = 0; d <= docs; ++d) {
    const uint64_t o = load_u64(s.offsets_ + 8 * d);
    if ((d == 0 && o != 0) || o < prev || o > tokens || (d == docs && o != tokens))
      return bad(name, absl::StrCat("document offset ", d, " is ", o, " (offsets run from 0 to ",
                                    tokens, ", non-decreasing)"));
    prev = o;
  }
  for (int64_t i = 0; i < s.num_tokens_; ++i) {
    if (width == 4 && load_u32(s.tokens_ + 4 * i) > static_cast<uint32_t>(INT32_MAX))
      return bad(name, absl::StrCat("token ", i, " has id ", load_u32(s.tokens_ + 4 * i),
                                    " (above 2^31 - 1)"));
    s.max_token_ = std::max(s.max_token_, s.token(i));
  }
  s.file_ = std::move(file);
  return s;
}

int64_t TokenShard::doc_begin(int64_t d) const {
  LOOM_CHECK(d >= 0 && d <= num_docs_, "TokenShard: document %lld of %lld",
             static_cast<long long>(d), static_cast<long long>(num_docs_));
  return static_cast<int64_t>(load_u64(offsets_ + 8 * d));
}

int32_t TokenShard::token(int64_t i) const {
  LOOM_CHECK(i >= 0 && i < num_tokens_, "TokenShard: token %lld of %lld", static_cast<long long>(i),
             static_cast<long long>(num_tokens_));
  if (token_bytes_ == 2) {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(tokens_ + 2 * i);
    return static_cast<int32_t>(b[0] | (b[1] << 8));
  }
  return static_cast<int32_t>(load_u32(tokens_ + 4 * i));
}

void TokenShard::read(int64_t begin, std::span<int32_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  LOOM_CHECK(begin >= 0 && begin + n <= num_tokens_, "TokenShard: read [%lld, %lld) of %lld",
             static_cast<long long>(begin), static_cast<long long>(begin + n),
             static_cast<long long>(num_tokens_));
  for (int64_t i = 0; i < n; ++i) out[i] = token(begin + i);
}

absl::Status TokenShardWriter::add_document(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("token shard: document ", num_docs(), " has id ", ids[i], " at ", i));
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  offsets_.push_back(tokens_.size());
  return absl::OkStatus();
}

std::string TokenShardWriter::serialize() const {
  int32_t most = 0;
  for (int32_t t : tokens_) most = std::max(most, t);
  const int width = most < 65536 ? 2 : 4;
  std::string out(kTokenShardMagic, 8);
  store(out, kTokenShardVersion, 4);
  store(out, static_cast<uint64_t>(width), 4);
  store(out, static_cast<uint64_t>(num_docs()), 8);
  store(out, static_cast<uint64_t>(num_tokens()), 8);
  for (uint64_t o : offsets_) store(out, o, 8);
  out.reserve(out.size() + width * tokens_.size());
  for (int32_t t : tokens_) store(out, static_cast<uint64_t>(t), width);
  return out;
}

absl::Status TokenShardWriter::write(const std::string& path) const {
  const std::string bytes = serialize();
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool flushed = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !flushed || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace loom
