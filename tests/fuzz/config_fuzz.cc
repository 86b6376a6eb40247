// libFuzzer target: arbitrary text through loom::parse_model_config. It must return an error or a
// config for any input, never crash; an accepted config is validated again (must not crash either).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "weights/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config =
      loom::parse_model_config(std::string_view(reinterpret_cast<const char*>(data), size));
  if (config.ok()) (void)config->validate();
  return 0;
}
