// Tensor: a strided view over a typed buffer on one device. Copying a Tensor copies the view and
// shares the storage (reference counted), like a torch tensor; `clone()` copies the data.
// Shapes are row-major with at most kMaxDims dimensions; kernels in Loom take Tensor arguments and
// check shapes, dtypes and contiguity at their entry.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace loom {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It begin, It end) {
    for (It it = begin; it != end; ++it) push_back(static_cast<int64_t>(*it));
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string to_string() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;

  // New contiguous tensor owning fresh (uninitialised) storage.
  static Tensor empty(Shape shape, DType dtype = DType::kF32, Device device = Device::kCpu);
  // Host-only helpers.
  static Tensor zeros(Shape shape, DType dtype = DType::kF32);
  static Tensor full(Shape shape, float value);
  // Wraps external memory; `owner` (may be null) keeps it alive as long as any view exists.
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device = Device::kCpu,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr || ndim() > 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + ndim() : i]; }
  int64_t stride(int i) const { return strides_[i < 0 ? i + ndim() : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  // Typed element access for tests and small host code (not for hot loops).
  template <typename T>
  T& at(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    int i = 0;
    for (int64_t v : idx) off += v * strides_[i++];
    return data<T>()[off];
  }

  // Views (share storage). `reshape` requires a contiguous tensor and the same numel.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) along `axis`.
  Tensor slice(int axis, int64_t begin, int64_t end) const;
  // Index `i` along dimension 0, dropping it.
  Tensor select(int64_t i) const;

  // Deep copy into a new contiguous tensor on the same device (a strided view: host only).
  Tensor clone() const;
  // A contiguous copy on `device` (this tensor itself when it already lives there and is
  // contiguous). Crossing devices goes through the registered copier (core/allocator.h):
  // synchronous, for tools, loads and tests.
  Tensor to(Device device) const;
  // Host conversion of a contiguous tensor to f32 (f32, bf16, f16 supported).
  Tensor to_f32() const;
  // Copies `src` (same shape and dtype) into this view: any views on the host; contiguous ones
  // when either side is on a device (synchronous, through core/allocator.h's copier).
  void copy_from(const Tensor& src) const;
  void fill(float value) const;  // f32 host only

  std::string describe() const;  // "f32[2, 3] cpu"

 private:
  void* data_ = nullptr;
  std::shared_ptr<void> storage_;
  Shape shape_;
  std::array<int64_t, kMaxDims> strides_{};
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;

  void set_contiguous_strides();
};

// Checks used at kernel entry; abort with the tensor's description (a programming error, not
// input).
#define LOOM_CHECK_SHAPE(t, ...)                                                               \
  LOOM_CHECK((t).shape() == ::loom::Shape({__VA_ARGS__}), "%s: expected shape %s, got %s", #t, \
             ::loom::Shape({__VA_ARGS__}).to_string().c_str(), (t).shape().to_string().c_str())
#define LOOM_CHECK_F32(t)                                               \
  LOOM_CHECK((t).dtype() == ::loom::DType::kF32 && (t).is_contiguous(), \
             "%s: expected contiguous f32, got %s", #t, (t).describe().c_str())

}  // namespace loom
