// Stored FP8 matrices (core/fp8_matrix.h) for the GPU FP8 tests and benchmark: random ones made on
// the host as the loader quantizes (per 128 x 128 block, scale = amax / 448, values rounded once to
// e4m3), their dequantized f32 values, and their upload with the scales (one allocation, the
// layout the parameter arena gives a device matrix); and the CPU twin of the activations'
// quantization per row and 128 columns (launch::quantize_fp8_groups).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/fp8_matrix.h"
#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"

namespace loom::fp8test {

// A host FP8 matrix [n, k] of N(0, 1) values times a per-block factor 2^U(-3, 3) (so that the
// blocks' scales differ and a scale applied to the wrong block shows).
inline Tensor random_fp8_matrix(std::mt19937_64& rng, int64_t n, int64_t k) {
  Tensor q = fp8_matrix_empty({n, k});
  const Tensor scales = fp8_matrix_scales(q);
  const int64_t gn = scales.dim(0), gk = scales.dim(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(kFp8BlockSize * kFp8BlockSize));
  auto* qp = static_cast<uint8_t*>(q.raw());
  for (int64_t bi = 0; bi < gn; ++bi) {
    for (int64_t bj = 0; bj < gk; ++bj) {
      const float factor = std::exp2(ud(rng));
      const int64_t r0 = bi * kFp8BlockSize, r1 = std::min(n, r0 + kFp8BlockSize);
      const int64_t c0 = bj * kFp8BlockSize, c1 = std::min(k, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const float x = nd(rng) * factor;
          v[(r - r0) * kFp8BlockSize + (c - c0)] = x;
          amax = std::max(amax, std::fabs(x));
        }
      }
      float s = amax / kFp8E4M3Max;
      if (!(s > 0.0f)) s = 1.0f;
      scales.data<float>()[bi * gk + bj] = s;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          qp[r * k + c] = f32_to_f8e4m3(
              static_cast<double>(v[(r - r0) * kFp8BlockSize + (c - c0)]) / static_cast<double>(s));
        }
      }
    }
  }
  return q;
}

// The reference's dequantized matrix: f32(q) * scale_inv of its block, one f32 product.
inline Tensor dequantized(const Tensor& q) {
  const Tensor scales = fp8_matrix_scales(q);
  const int64_t n = q.dim(0), k = q.dim(1), gk = scales.dim(1);
  Tensor w = Tensor::empty({n, k});
  const float* lut = f8e4m3_table();
  const auto* qp = static_cast<const uint8_t*>(q.raw());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const float s = scales.data<float>()[(r / kFp8BlockSize) * gk + c / kFp8BlockSize];
      w.data<float>()[r * k + c] = lut[qp[r * k + c]] * s;
    }
  }
  return w;
}

// The CPU twin of launch::quantize_fp8_groups (same f32 operations: amax, amax / 448, the f32
// quotient rounded to nearest even e4m3, saturated).
struct GroupQuant {
  std::vector<uint8_t> q;  // [m, k]
  std::vector<float> s;    // [g * m + r]
  Tensor xq;               // f32 [m, k]: the dequantized values s_g * f32(q)
};
inline GroupQuant quantize_groups(const Tensor& x) {
  const int64_t m = x.dim(0), k = x.dim(1), groups = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  GroupQuant g{std::vector<uint8_t>(m * k), std::vector<float>(groups * m), Tensor::empty({m, k})};
  const float* lut = f8e4m3_table();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < groups; ++b) {
      const int64_t c0 = b * kFp8BlockSize, c1 = std::min(k, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c)
        amax = std::max(amax, std::fabs(x.data<float>()[r * k + c]));
      float s = amax / kFp8E4M3Max;
      if (!(s > 0.0f)) s = 1.0f;
      g.s[b * m + r] = s;
      for (int64_t c = c0; c < c1; ++c) {
        const float quotient = x.data<float>()[r * k + c] / s;
        const uint8_t q = f32_to_f8e4m3(static_cast<double>(quotient));
        g.q[r * k + c] = q;
        g.xq.data<float>()[r * k + c] = lut[q] * s;
      }
    }
  }
  return g;
}

// The device copy of a stored host FP8 matrix: values, trailer and scales in one allocation.
inline Tensor fp8_to_device(const Tensor& q) {
  cuda::init();  // registers the device allocator
  const size_t bytes = fp8_storage_bytes(q.shape());
  std::shared_ptr<void> mem = allocate_buffer(bytes, Device::kCuda);
  LOOM_CUDA_CHECK(cudaMemcpy(mem.get(), q.raw(), bytes, cudaMemcpyHostToDevice));
  return Tensor::wrap(mem.get(), q.shape(), DType::kF8E4M3, Device::kCuda, mem);
}

}  // namespace loom::fp8test
