// FP8 KV vectors on the host (the format of kernels/attention.h, kKvFp8ScaleBytes): one vector of
// n values as n e4m3fn codes followed by its f32 scale. The cache write quantizes with
// kv_fp8_quantize; the attention reads widen whole page runs with kv_fp8_dequantize_rows.
#pragma once

#include <cstdint>

namespace loom::cpu {

// dst[0, n) = e4m3(x / scale), dst[n, n + 4) = scale = f32(amax / 448) (1 for an all-zero vector,
// NaN with zero codes when x holds a non-finite value). The quotient is formed in double, so
// each code is rounded once (core's f32_to_f8e4m3: nearest even, saturated to +-448).
void kv_fp8_quantize(const float* x, int64_t n, uint8_t* dst);

// out[i] = f32(code[i]) * scale for one vector of n values (src as kv_fp8_quantize writes it).
void kv_fp8_dequantize(const uint8_t* src, int64_t n, float* out);

// `rows` consecutive pool rows of `vectors` vectors of n values each (row stride vectors * (n +
// 4) bytes) into rows * vectors * n floats, row after row, each row's vectors side by side.
void kv_fp8_dequantize_rows(const uint8_t* src, int64_t rows, int64_t vectors, int64_t n,
                            float* out);

}  // namespace loom::cpu
