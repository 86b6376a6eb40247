// libFuzzer target: arbitrary bytes as a loom-trainer run config (parse_run_config). An accepted
// config must satisfy every bound the parser promises.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "trainer/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = loom::parse_run_config(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!c.ok()) return 0;
  if (c->batch_size < 1 || c->steps < 1 || c->seq_len < 2 || c->out.empty()) __builtin_trap();
  if (c->model_config.empty() == c->model_checkpoint.empty()) __builtin_trap();
  if (c->task == "mqar" && !c->mqar.validate().ok()) __builtin_trap();
  if (c->task == "shards" && c->shards.empty()) __builtin_trap();
  if (!c->optimizer.validate().ok()) __builtin_trap();
  if (c->data_parallel < 1 || c->batch_size % c->data_parallel != 0 ||
      (c->data_parallel > 1 && c->device.is_cuda() && c->device.index != 0))
    __builtin_trap();
  if (c->loss_bucket < 1 || c->stage_stability.window < 1 || !(c->stage_stability.tolerance >= 0))
    __builtin_trap();
  for (const loom::StageConfig& s : c->stages) {
    if (s.seq_len < 2 || s.max_steps < 1 || s.min_steps < 0 || s.min_steps > s.max_steps ||
        s.rope_theta < 0)
      __builtin_trap();
    if (c->task == "mqar" && (s.mqar.seq_len != s.seq_len || !s.mqar.validate().ok()))
      __builtin_trap();
  }
  return 0;
}
