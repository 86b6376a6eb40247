// How Loom stores a block-scaled FP8 weight matrix (WeightDType::kFP8, weights/parameter_arena.h):
// float8_e4m3fn values with one f32 scale per 128 x 128 block, DeepSeek-V3's layout
// (w[r, c] = f32(q[r, c]) * scale_inv[r / 128, c / 128], an f32 product; the last block of a
// dimension that is not a multiple of 128 is partial).
//
// The pair lives in ONE allocation, and the Tensor handed out is the e4m3 matrix itself
// (dtype kF8E4M3, shape [N, K], or [E, N, K] for a layer's stacked experts, contiguous):
//
//   [q: numel bytes] [pad to 16] [trailer: magic, numel (16 bytes)] [scale_inv: f32 [E?, gn, gk]]
//
// with gn = ceil(N / 128), gk = ceil(K / 128). So every op that takes a weight matrix
// (linear_forward, moe_grouped_swiglu) gets its scales through the tensor it already takes, the
// model code and the ops' signatures stay as they are, and a GPU kernel finds the scales at a fixed
// offset from the matrix's device pointer (same storage on both backends). Only a whole matrix (as
// the parameter arena or fp8_matrix_empty gives it) carries its scales: views (slice, clone) do
// not, and on the host fp8_matrix_scales checks the trailer so that a view is refused rather than
// misread.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"

namespace loom {

inline constexpr int64_t kFp8BlockSize =
    128;  // rows and columns per scale (DeepSeek-V3's [128, 128])
inline constexpr float kFp8E4M3Max = 448.0f;  // e4m3fn's largest finite value

namespace fp8_detail {
inline constexpr uint64_t kMagic = 0x4c4f4f4d46503842ull;  // "LOOMFP8B"
inline int64_t trailer_offset(int64_t numel) { return (numel + 15) / 16 * 16; }
inline int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }
}  // namespace fp8_detail

// The scale grid of a matrix shape [.., N, K]: [.., ceil(N / 128), ceil(K / 128)].
inline Shape fp8_scale_shape(const Shape& shape) {
  LOOM_CHECK(shape.ndim() >= 2, "fp8 matrix of shape %s: needs 2 or more dims",
             shape.to_string().c_str());
  Shape s = shape;
  s[shape.ndim() - 2] = fp8_detail::blocks(shape[shape.ndim() - 2]);
  s[shape.ndim() - 1] = fp8_detail::blocks(shape[shape.ndim() - 1]);
  return s;
}

// Bytes of one stored matrix of `shape`: values, padding, trailer and scales.
inline size_t fp8_storage_bytes(const Shape& shape) {
  return static_cast<size_t>(fp8_detail::trailer_offset(shape.numel()) + 16 +
                             4 * fp8_scale_shape(shape).numel());
}

// Writes the trailer of a matrix whose storage starts at `q` (host memory).
inline void fp8_write_trailer(void* q, int64_t numel) {
  const uint64_t t[2] = {fp8_detail::kMagic, static_cast<uint64_t>(numel)};
  std::memcpy(static_cast<char*>(q) + fp8_detail::trailer_offset(numel), t, sizeof t);
}

// The scale grid of the stored matrix `w` (see above), as a view into w's storage on w's device:
// valid while w's storage lives. Aborts for anything but a whole stored FP8 matrix (on the host,
// the trailer must match; a device pointer is not dereferenced).
inline Tensor fp8_matrix_scales(const Tensor& w) {
  LOOM_CHECK(w.dtype() == DType::kF8E4M3 && w.is_contiguous() && w.ndim() >= 2,
             "fp8 matrix: expected a contiguous f8e4m3 matrix, got %s", w.describe().c_str());
  char* base = static_cast<char*>(w.raw()) + fp8_detail::trailer_offset(w.numel());
  if (w.device().is_cpu()) {
    uint64_t t[2];
    std::memcpy(t, base, sizeof t);
    LOOM_CHECK(t[0] == fp8_detail::kMagic && t[1] == static_cast<uint64_t>(w.numel()),
               "fp8 matrix %s carries no block scales: only a whole matrix from the parameter "
               "arena (or fp8_matrix_empty) does, not a view or a copy",
               w.describe().c_str());
  }
  return Tensor::wrap(base + 16, fp8_scale_shape(w.shape()), DType::kF32, w.device());
}

// A fresh host FP8 matrix of `shape` with room for its scales (trailer written; values and
// scales uninitialised), laid out as the parameter arena lays one out.
inline Tensor fp8_matrix_empty(const Shape& shape) {
  const size_t bytes = (fp8_storage_bytes(shape) + 63) / 64 * 64;
  std::shared_ptr<void> mem(std::aligned_alloc(64, bytes), std::free);
  LOOM_CHECK(mem != nullptr, "fp8 matrix: allocating %zu bytes failed", bytes);
  fp8_write_trailer(mem.get(), shape.numel());
  return Tensor::wrap(mem.get(), shape, DType::kF8E4M3, Device::kCpu, mem);
}

}  // namespace loom
