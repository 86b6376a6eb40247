// libFuzzer target: arbitrary bytes through TokenShard::parse. Every accepted shard must let
// every document and token be read (ASan catches any read outside the bytes), with offsets that
// tile the tokens and ids no larger than max_token().
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto shard = loom::TokenShard::parse(
      loom::MappedFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz"));
  if (!shard.ok()) return 0;
  int64_t prev = 0;
  for (int64_t d = 0; d <= shard->num_docs(); ++d) {
    const int64_t b = shard->doc_begin(d);
    if (b < prev || b > shard->num_tokens()) __builtin_trap();
    prev = b;
  }
  if (prev != shard->num_tokens()) __builtin_trap();
  std::vector<int32_t> all(static_cast<size_t>(shard->num_tokens()));
  shard->read(0, all);
  for (int32_t t : all)
    if (t < 0 || t > shard->max_token()) __builtin_trap();
  return 0;
}
