#include "engine/model/step_data.h"

#include "core/allocator.h"
#include "core/status.h"

namespace loom {
namespace {
constexpr size_t kAlign = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

StepData::StepData(Device device) : device_(device) {
  LOOM_CHECK(device.is_cpu(), "StepData on %s: the CUDA step upload comes with the CUDA forward",
             device_name(device).c_str());
}

size_t StepData::bytes_for(const StepShape& s) {
  return aligned(s.tokens * 4) + aligned(s.tokens * 8) + aligned(s.logit_rows * 8) +
         aligned((s.seqs + 1) * 8) + aligned(s.seqs * 8) + aligned(s.seqs * 4) +
         aligned(s.seqs * s.page_cols * 4);
}

void StepData::reserve(const StepShape& largest) {
  const size_t need = bytes_for(largest);
  if (need > capacity_) {
    capacity_ = need;
    block_ = allocate_buffer(capacity_, device_);
  }
}

void StepData::begin(const StepShape& shape) {
  reserve(shape);
  struct Part {
    Tensor* view;
    Shape shape;
    DType dtype;
  };
  const Part parts[] = {
      {&token_ids, {shape.tokens}, DType::kI32},
      {&positions, {shape.tokens}, DType::kI64},
      {&logit_rows, {shape.logit_rows}, DType::kI64},
      {&cu_seqlens, {shape.seqs + 1}, DType::kI64},
      {&past_lens, {shape.seqs}, DType::kI64},
      {&state_slots, {shape.seqs}, DType::kI32},
      {&page_table, {shape.seqs, shape.page_cols}, DType::kI32},
  };
  char* base = static_cast<char*>(block_.get());
  size_t offset = 0;
  for (const Part& p : parts) {
    *p.view = Tensor::wrap(base + offset, p.shape, p.dtype, device_, block_);
    offset += aligned(p.shape.numel() * dtype_size(p.dtype));
  }
}

void StepData::publish() { ++transfers_; }

}  // namespace loom
