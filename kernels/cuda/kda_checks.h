// The activation rule every CUDA KDA / Gated DeltaNet kernel shares (recurrent, chunked, batched
// decode): q, k, v and out all f32 or all bf16 (the kernels read and write one activation type),
// beta f32 or of their dtype, each contiguous. Decay gates and states are f32 and checked by the
// callers with their shapes.
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace loom::cuda {

inline void check_kda_activations(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& beta, const Tensor& out) {
  const DType act = q.dtype();
  LOOM_CHECK((act == DType::kF32 || act == DType::kBF16) && k.dtype() == act && v.dtype() == act &&
                 out.dtype() == act && (beta.dtype() == DType::kF32 || beta.dtype() == act),
             "%s: q %s k %s v %s beta %s out %s: expected f32 or bf16 activations, beta f32 or "
             "of their dtype",
             fn, q.describe().c_str(), k.describe().c_str(), v.describe().c_str(),
             beta.describe().c_str(), out.describe().c_str());
  LOOM_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && beta.is_contiguous() &&
                 out.is_contiguous(),
             "%s: q, k, v, beta and out must be contiguous", fn);
}

}  // namespace loom::cuda
