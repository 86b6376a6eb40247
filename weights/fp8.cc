#include "weights/fp8.h"

#include "absl/strings/str_cat.h"
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
  if (q.ndim() != 2) return bad(absl::StrCat("shape ", q.shape().to_string(), " is not 2-D"));
  if (block_rows <= 0 || block_cols <= 0)
    return bad("the config has no FP8 weight_block_size (quantization_config)");
  const int64_t rows = q.dim(0), cols = q.dim(1);
  const int64_t grid_r = (rows + block_rows - 1) / block_rows;
  const int64_t grid_c = (cols + block_cols - 1) / block_cols;
  if (scale_inv.ndim() != 2 || scale_inv.dim(0) != grid_r || scale_inv.dim(1) != grid_c)
    return bad(absl::StrCat("weight_scale_inv has shape ", scale_inv.shape().to_string(),
                            "; blocks of ", block_rows, " x ", block_cols, " over ",
                            q.shape().to_string(), " need [", grid_r, ", ", grid_c, "]"));
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
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = sp + (r / block_rows) * grid_c;
    float* wrow = wp + r * cols;
    for (int64_t c = 0; c < cols; ++c) wrow[c] *= srow[c / block_cols];
  }
  return w;
}

}  // namespace loom
