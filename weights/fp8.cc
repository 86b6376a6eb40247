#include "weights/fp8.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/fp8_matrix.h"
#include "core/status.h"

namespace loom {

absl::StatusOr<Tensor> dequantize_fp8_blocks(const Tensor& q, const Tensor& scale_inv,
                                             int block_rows, int block_cols,
                                             std::string_view name) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 tensor '", absl_sv(name), "': ", absl_sv(why)));
  };
  if (q.dtype() != DType::kF8E4M3 && q.dtype() != DType::kF8E5M2)
    return bad(absl::StrCat("dtype ", absl_sv(dtype_name(q.dtype())), " is not FP8"));
  if (q.ndim() != 2 && q.ndim() != 3)
    return bad(absl::StrCat("shape ", q.shape().to_string(), " is not 2-D (or a 3-D stack)"));
  if (block_rows <= 0 || block_cols <= 0)
    return bad("the config has no FP8 weight_block_size (quantization_config)");
  const int64_t stack = q.ndim() == 3 ? q.dim(0) : 1;
  const int64_t rows = q.dim(-2), cols = q.dim(-1);
  const int64_t grid_r = (rows + block_rows - 1) / block_rows;
  const int64_t grid_c = (cols + block_cols - 1) / block_cols;
  Shape want = q.ndim() == 3 ? Shape({stack, grid_r, grid_c}) : Shape({grid_r, grid_c});
  if (scale_inv.shape() != want)
    return bad(absl::StrCat("weight_scale_inv has shape ", scale_inv.shape().to_string(),
                            "; blocks of ", block_rows, " x ", block_cols, " over ",
                            q.shape().to_string(), " need ", want.to_string()));
  Tensor scales;
  if (scale_inv.dtype() == DType::kF32) {
    scales = scale_inv.is_contiguous() ? scale_inv : scale_inv.clone();
  } else if (scale_inv.dtype() == DType::kBF16 || scale_inv.dtype() == DType::kF16) {
    scales = scale_inv.to_f32();
  } else {
    return bad(absl::StrCat("weight_scale_inv has dtype ", absl_sv(dtype_name(scale_inv.dtype())),
                            "; expected a float type"));
  }
  Tensor w = q.to_f32();  // exact widening
  float* wp = w.data<float>();
  const float* sp = scales.data<float>();
  for (int64_t e = 0; e < stack; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* srow = sp + (e * grid_r + r / block_rows) * grid_c;
      float* wrow = wp + (e * rows + r) * cols;
      for (int64_t c = 0; c < cols; ++c) wrow[c] *= srow[c / block_cols];
    }
  }
  return w;
}

absl::Status quantize_fp8_blocks(const Tensor& w, const Tensor& q, std::string_view name) {
  LOOM_CHECK(w.dtype() == DType::kF32 && w.is_contiguous() && w.device().is_cpu() &&
                 w.shape() == q.shape(),
             "quantize_fp8_blocks: w %s q %s", w.describe().c_str(), q.describe().c_str());
  const Tensor scales = fp8_matrix_scales(q);
  const int64_t rows = w.dim(-2), cols = w.dim(-1), stack = w.numel() / (rows * cols);
  const int64_t gr = scales.dim(-2), gc = scales.dim(-1);
  const float* wp = w.data<float>();
  auto* qp = static_cast<uint8_t*>(q.raw());
  float* sp = scales.data<float>();
  for (int64_t e = 0; e < stack; ++e) {
    for (int64_t bi = 0; bi < gr; ++bi) {
      const int64_t r0 = bi * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      for (int64_t bj = 0; bj < gc; ++bj) {
        const int64_t c0 = bj * kFp8BlockSize, c1 = std::min(cols, c0 + kFp8BlockSize);
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = wp + (e * rows + r) * cols;
          for (int64_t c = c0; c < c1; ++c) {
            if (!std::isfinite(row[c]))
              return absl::InvalidArgumentError(absl::StrCat("cannot quantize '", absl_sv(name),
                                                             "' to fp8: element [", e * rows + r,
                                                             ", ", c, "] is ", row[c]));
            amax = std::max(amax, std::fabs(row[c]));
          }
        }
        // The largest magnitude maps to 448 exactly; an all-zero block keeps scale 1, so that
        // its zeros dequantize to zeros (0 * 1) rather than 0 * 0 or 0 / 0.
        // (A block of only denormals so small that amax / 448 underflows to 0 is all zeros in
        // e4m3 under any scale: scale 1 too.)
        float scale = amax / kFp8E4M3Max;
        if (!(scale > 0.0f)) scale = 1.0f;
        sp[(e * gr + bi) * gc + bj] = scale;
        for (int64_t r = r0; r < r1; ++r) {
          const float* row = wp + (e * rows + r) * cols;
          uint8_t* qrow = qp + (e * rows + r) * cols;
          for (int64_t c = c0; c < c1; ++c)
            qrow[c] = f32_to_f8e4m3(static_cast<double>(row[c]) / static_cast<double>(scale));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace loom
