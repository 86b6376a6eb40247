#include "kernels/cpu/activation.h"

#include <cmath>
#include <cstring>

#include "kernels/activation.h"

namespace loom::cpu {

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  LOOM_CHECK_F32(gate);
  LOOM_CHECK_F32(up);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(up.shape() == gate.shape() && out.shape() == gate.shape(),
             "silu_mul_forward: gate %s up %s out %s", gate.describe().c_str(),
             up.describe().c_str(), out.describe().c_str());
  silu_mul(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
}

void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  const float* d = dout.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  const int64_t n = gate.numel();
  // Element i reads gate, up and dout at i before writing i: the outputs may alias the inputs.
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], ui = u[i], di = d[i];
    const float s = 1.0f / (1.0f + std::exp(-gi));
    const float sn = 1.0f / (1.0f + std::exp(gi));  // 1 - s without its cancellation near s = 1
    dg[i] = di * ui * (s * (1.0f + gi * sn));
    du[i] = di * (gi * s);
  }
}

namespace {
template <typename Id>
void gather_rows(const Id* ids, int64_t t, const float* table, int64_t v, int64_t d, float* out) {
  // Validate every id before writing anything (a bad id is a caller bug: abort with the id).
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    LOOM_CHECK(id >= 0 && id < v, "embedding_forward: ids[%d] = %d outside [0, %d)", i, id, v);
  }
#pragma omp parallel for schedule(static) if (t * d > 65536)
  for (int64_t i = 0; i < t; ++i) {
    std::memcpy(out + i * d, table + static_cast<int64_t>(ids[i]) * d, sizeof(float) * d);
  }
}
}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  LOOM_CHECK(ids.ndim() == 1 && ids.is_contiguous() &&
                 (ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64),
             "embedding_forward: ids must be contiguous i32/i64 [T], got %s",
             ids.describe().c_str());
  LOOM_CHECK_F32(table);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(table.ndim() == 2, "embedding_forward: table %s", table.describe().c_str());
  const int64_t t = ids.dim(0);
  const int64_t v = table.dim(0);
  const int64_t d = table.dim(1);
  LOOM_CHECK_SHAPE(out, t, d);
  if (ids.dtype() == DType::kI32) {
    gather_rows(ids.data<int32_t>(), t, table.data<float>(), v, d, out.data<float>());
  } else {
    gather_rows(ids.data<int64_t>(), t, table.data<float>(), v, d, out.data<float>());
  }
}

}  // namespace loom::cpu
