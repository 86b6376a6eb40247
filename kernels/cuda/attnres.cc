// Host side of the CUDA Block-AttnRes aggregation: the checks kernels/attnres.cc makes for every
// device, the CUDA-specific ones (device, contiguity, aliasing, D), then one launch.
#include "kernels/cuda/attnres.h"

#include "kernels/cuda/attnres_launch.h"
#include "kernels/cuda/device.h"

namespace loom::cuda {

void attnres_aggregate(const Exec& ex, const Tensor& sources, const Tensor& query,
                       const Tensor& key_norm, const Tensor& out_norm, float eps,
                       const Tensor& out) {
  static constexpr const char* kOp = "attnres_aggregate";
  LOOM_CHECK_CUDA_ARG(kOp, sources);
  LOOM_CHECK_CUDA_ARG(kOp, query);
  LOOM_CHECK_CUDA_ARG(kOp, key_norm);
  LOOM_CHECK_CUDA_ARG(kOp, out_norm);
  LOOM_CHECK_CUDA_ARG(kOp, out);
  for (const Tensor* t : {&sources, &query, &key_norm, &out_norm}) LOOM_CHECK_F32(*t);
  LOOM_CHECK((out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) && out.is_contiguous(),
             "%s: out %s, expected contiguous f32 or bf16", kOp, out.describe().c_str());
  LOOM_CHECK(sources.ndim() == 3 && sources.dim(0) >= 1, "%s: sources %s, expected [S >= 1, N, D]",
             kOp, sources.describe().c_str());
  const int64_t s = sources.dim(0), n = sources.dim(1), d = sources.dim(2);
  LOOM_CHECK_SHAPE(out, n, d);
  for (const Tensor* t : {&query, &key_norm, &out_norm}) {
    LOOM_CHECK(t->numel() == d, "%s: weight %s for D = %d", kOp, t->describe().c_str(), d);
  }
  LOOM_CHECK(d <= launch::kAttnResMaxDim, "%s: D = %d (the CUDA kernel takes up to %d)", kOp, d,
             launch::kAttnResMaxDim);
  const char* lo = static_cast<const char*>(sources.raw());
  const char* o = static_cast<const char*>(out.raw());
  LOOM_CHECK(n * d == 0 || o + out.nbytes() <= lo || lo + sources.nbytes() <= o,
             "%s: out aliases the sources", kOp);
  launch::attnres_aggregate(stream_of(ex), sources.data<float>(), query.data<float>(),
                            key_norm.data<float>(), out_norm.data<float>(), eps, out.raw(),
                            out.dtype() == DType::kBF16, s, n, d);
}

}  // namespace loom::cuda
