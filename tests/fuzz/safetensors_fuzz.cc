// libFuzzer target: arbitrary bytes through SafetensorsFile::from_bytes. Every accepted image must
// yield, for each name, a tensor whose bytes can all be read (ASan catches any out-of-range view).
#include <cstddef>
#include <cstdint>
#include <string>

#include "weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = loom::SafetensorsFile::from_bytes(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) return 0;
  for (const std::string& name : (*file)->names()) {
    const auto* entry = (*file)->find(name);
    if (entry == nullptr) __builtin_trap();
    auto t = (*file)->get(name);
    if (!t.ok()) __builtin_trap();
    if (t->shape() != entry->shape || t->dtype() != entry->dtype) __builtin_trap();
    if (t->nbytes() != entry->end - entry->begin) __builtin_trap();
    if (reinterpret_cast<uintptr_t>(t->raw()) % loom::dtype_size(t->dtype()) != 0) __builtin_trap();
    const auto* p = static_cast<const volatile unsigned char*>(t->raw());
    unsigned sum = 0;
    for (size_t i = 0; i < t->nbytes(); ++i) sum += p[i];
    (void)sum;
  }
  for (const auto& [k, v] : (*file)->metadata()) (void)(k.size() + v.size());
  return 0;
}
