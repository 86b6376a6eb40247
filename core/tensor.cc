#include "core/tensor.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"

namespace loom {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

void Shape::push_back(int64_t d) {
  LOOM_CHECK(ndim_ < kMaxDims, "too many dimensions");
  dims_[ndim_++] = d;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const { return absl::StrCat("[", absl::StrJoin(*this, ", "), "]"); }

void Tensor::set_contiguous_strides() {
  int64_t s = 1;
  for (int i = shape_.ndim() - 1; i >= 0; --i) {
    strides_[i] = s;
    s *= shape_[i];
  }
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.set_contiguous_strides();
  t.storage_ = allocate_buffer(t.nbytes(), device);
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(shape, dtype, Device::kCpu);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, float value) {
  Tensor t = empty(shape, DType::kF32, Device::kCpu);
  t.fill(value);
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.storage_ = std::move(owner);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.set_contiguous_strides();
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshape(Shape shape) const {
  LOOM_CHECK(is_contiguous(), "reshape of a non-contiguous tensor %s", describe().c_str());
  LOOM_CHECK(shape.numel() == numel(), "reshape %s to %s", describe().c_str(),
             shape.to_string().c_str());
  Tensor t = *this;
  t.shape_ = shape;
  t.set_contiguous_strides();
  return t;
}

Tensor Tensor::slice(int axis, int64_t begin, int64_t end) const {
  if (axis < 0) axis += ndim();
  LOOM_CHECK(axis >= 0 && axis < ndim() && 0 <= begin && begin <= end && end <= shape_[axis],
             "slice(%d, %lld, %lld) of %s", axis, static_cast<long long>(begin),
             static_cast<long long>(end), describe().c_str());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + begin * strides_[axis] * dtype_size(dtype_);
  t.shape_[axis] = end - begin;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  LOOM_CHECK(ndim() >= 1 && i >= 0 && i < shape_[0], "select(%lld) of %s",
             static_cast<long long>(i), describe().c_str());
  Tensor t;
  t.storage_ = storage_;
  t.data_ = static_cast<char*>(data_) + i * strides_[0] * dtype_size(dtype_);
  t.dtype_ = dtype_;
  t.device_ = device_;
  for (int d = 1; d < ndim(); ++d) {
    t.shape_.push_back(shape_[d]);
    t.strides_[d - 1] = strides_[d];
  }
  return t;
}

namespace {
// Calls f(offset_in_elements) for every element of a strided tensor in row-major order.
template <typename F>
void for_each_offset(const Shape& shape, const std::array<int64_t, kMaxDims>& strides, F&& f) {
  const int64_t n = shape.numel();
  if (n == 0) return;
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = 0;
  for (int64_t e = 0; e < n; ++e) {
    f(off);
    for (int d = shape.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) const {
  LOOM_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy %s into %s",
             src.describe().c_str(), describe().c_str());
  if (!device_.is_cpu() || !src.device_.is_cpu()) {
    LOOM_CHECK(is_contiguous() && src.is_contiguous(), "copy %s into %s: strided device copy",
               src.describe().c_str(), describe().c_str());
    copy_bytes(data_, device_, src.data_, src.device_, nbytes());
    return;
  }
  const size_t es = dtype_size(dtype_);
  if (is_contiguous() && src.is_contiguous()) {
    std::memcpy(data_, src.data_, nbytes());
    return;
  }
  // Gather src into a contiguous staging order, then scatter into this view.
  std::vector<char> staging(nbytes());
  char* out = staging.data();
  const char* in = static_cast<const char*>(src.data_);
  for_each_offset(src.shape_, src.strides_, [&](int64_t off) {
    std::memcpy(out, in + off * es, es);
    out += es;
  });
  const char* s = staging.data();
  char* dst = static_cast<char*>(data_);
  for_each_offset(shape_, strides_, [&](int64_t off) {
    std::memcpy(dst + off * es, s, es);
    s += es;
  });
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_ && is_contiguous()) return *this;
  // A strided host view is gathered on the host first; a strided device view is refused by
  // copy_from.
  const Tensor src = device_.is_cpu() && !is_contiguous() ? clone() : *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(src);
  return t;
}

Tensor Tensor::to_f32() const {
  LOOM_CHECK(device_ == Device::kCpu, "to_f32 on host only");
  Tensor src = is_contiguous() ? *this : clone();
  if (dtype_ == DType::kF32) return src.clone();
  Tensor t = empty(shape_, DType::kF32, Device::kCpu);
  const int64_t n = numel();
  float* out = t.data<float>();
  const uint16_t* in = static_cast<const uint16_t*>(src.raw());
  const uint8_t* in8 = static_cast<const uint8_t*>(src.raw());
  if (dtype_ == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
  } else if (dtype_ == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
  } else if (dtype_ == DType::kF8E4M3) {
    for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(in8[i]);
  } else if (dtype_ == DType::kF8E5M2) {
    for (int64_t i = 0; i < n; ++i) out[i] = f8e5m2_to_f32(in8[i]);
  } else {
    LOOM_CHECK(false, "to_f32 of %s", describe().c_str());
  }
  return t;
}

void Tensor::fill(float value) const {
  LOOM_CHECK(dtype_ == DType::kF32 && device_ == Device::kCpu && is_contiguous(), "fill of %s",
             describe().c_str());
  float* p = data<float>();
  for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

std::string Tensor::describe() const {
  return absl::StrCat(absl_sv(dtype_name(dtype_)), shape_.to_string(), " ", device_name(device_));
}

}  // namespace loom
