#include "engine/model/step_data.h"

#include "core/allocator.h"
#include "core/status.h"

namespace loom {
namespace {
constexpr size_t kAlign = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

StepData::StepData(Device device) : device_(device) {}

size_t StepData::bytes_for(const StepShape& s) {
  return aligned(s.tokens * 4) + aligned(s.tokens * 8) + aligned(s.logit_rows * 8) +
         aligned((s.seqs + 1) * 8) + aligned(s.seqs * 8) + aligned(s.seqs * 4) +
         aligned(s.seqs * s.page_cols * 4);
}

void StepData::reserve(const StepShape& largest) {
  const size_t need = bytes_for(largest);
  if (need > capacity_) {
    capacity_ = need;
    block_ = allocate_buffer(capacity_, Device::kCpu);
    if (!device_.is_cpu()) device_block_ = allocate_buffer(capacity_, device_);
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
    *p.view = Tensor::wrap(base + offset, p.shape, p.dtype, Device::kCpu, block_);
    offset += aligned(p.shape.numel() * dtype_size(p.dtype));
  }
  used_ = offset;
}

void StepData::publish(const Exec& ex) {
  LOOM_CHECK(ex.device == device_, "StepData on %s published on %s", device_name(device_).c_str(),
             device_name(ex.device).c_str());
  if (before_publish_) before_publish_(ex);
  if (!device_.is_cpu()) upload_async(ex, device_block_.get(), block_.get(), used_);
  ++transfers_;
}

Tensor StepData::on_device(const Tensor& field) const {
  if (device_.is_cpu()) return field;
  const size_t offset =
      static_cast<const char*>(field.raw()) - static_cast<const char*>(block_.get());
  LOOM_CHECK(offset + field.nbytes() <= used_, "StepData::on_device: %s is not a step field",
             field.describe().c_str());
  return Tensor::wrap(static_cast<char*>(device_block_.get()) + offset, field.shape(),
                      field.dtype(), device_, device_block_);
}

}  // namespace loom
