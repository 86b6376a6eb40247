// Host side of the CUDA backward kernels (kernels/cuda/backward.h): device checks, temporaries,
// launches. The dispatchers in kernels/ have checked shapes, dtypes and aliasing already.
#include "kernels/cuda/backward.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cuda/backward_launch.h"
#include "kernels/cuda/device.h"

namespace loom::cuda {
namespace {

const float* f(const Tensor& t) { return static_cast<const float*>(t.raw()); }
float* fm(const Tensor& t) { return static_cast<float*>(t.raw()); }

void check_args(const char* fn, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) check_on_device(fn, "tensor", *t);
}

}  // namespace

void rmsnorm_backward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                      float weight_offset, const Tensor& dout, const Tensor& dx, const Tensor& dw) {
  check_args("rmsnorm_backward", {&x, &w, &dout, &dx, &dw});
  const int64_t d = x.dim(-1);
  const int64_t n = d > 0 ? x.numel() / d : 0;
  if (n == 0 || d == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (n + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch rstd(static_cast<size_t>(n) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * d) * sizeof(float), s);
  float* rs = static_cast<float*>(rstd.get());
  launch::row_rstd(s, f(x), n, d, eps, rs);
  // dw reads x and dout before dx (which may alias either) is written.
  launch::column_sums(s, f(dout), f(x), rs, n, d, static_cast<float*>(partials.get()), fm(dw));
  launch::rmsnorm_dx(s, f(x), f(w), weight_offset, f(dout), rs, n, d, fm(dx));
}

void l2norm_backward(const Exec& ex, const Tensor& x, float eps, float scale, const Tensor& dout,
                     const Tensor& dx) {
  check_args("l2norm_backward", {&x, &dout, &dx});
  const int64_t d = x.dim(-1);
  const int64_t n = d > 0 ? x.numel() / d : 0;
  launch::l2norm_dx(stream_of(ex), f(x), f(dout), n, d, eps, scale, fm(dx));
}

void silu_mul_backward(const Exec& ex, const Tensor& gate, const Tensor& up, const Tensor& dout,
                       const Tensor& dgate, const Tensor& dup) {
  check_args("silu_mul_backward", {&gate, &up, &dout, &dgate, &dup});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kSiluMul, f(gate), f(up), f(dout),
                        gate.numel(), fm(dgate), fm(dup));
}

void add_bias_backward(const Exec& ex, const Tensor& dx, const Tensor& dbias) {
  check_args("add_bias_backward", {&dx, &dbias});
  const int64_t n = dx.dim(0), c = dx.dim(1);
  if (n == 0 || c == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (n + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch partials(static_cast<size_t>(chunks * c) * sizeof(float), s);
  launch::column_sums(s, f(dx), nullptr, nullptr, n, c, static_cast<float*>(partials.get()),
                      fm(dbias));
}

void mul_sigmoid_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                          const Tensor& dx, const Tensor& dgate) {
  check_args("mul_sigmoid_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kMulSigmoid, f(x), f(gate), f(dout),
                        x.numel(), fm(dx), fm(dgate));
}

void mul_silu_backward(const Exec& ex, const Tensor& x, const Tensor& gate, const Tensor& dout,
                       const Tensor& dx, const Tensor& dgate) {
  check_args("mul_silu_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::gate_backward(stream_of(ex), launch::GateGrad::kMulSilu, f(x), f(gate), f(dout),
                        x.numel(), fm(dx), fm(dgate));
}

void mul_sigmoid_rows_backward(const Exec& ex, const Tensor& x, const Tensor& gate,
                               const Tensor& dout, const Tensor& dx, const Tensor& dgate) {
  check_args("mul_sigmoid_rows_backward", {&x, &gate, &dout, &dx, &dgate});
  launch::mul_sigmoid_rows_backward(stream_of(ex), f(x), f(gate), f(dout), x.dim(0), x.dim(1),
                                    fm(dx), fm(dgate));
}

void sigmoid_backward(const Exec& ex, const Tensor& y, const Tensor& dout, const Tensor& dx) {
  check_args("sigmoid_backward", {&y, &dout, &dx});
  launch::sigmoid_backward(stream_of(ex), f(y), f(dout), y.numel(), fm(dx));
}

void causal_conv1d_backward(const Exec& ex, const Tensor& x, const Tensor& weight,
                            const Tensor& initial_state, bool apply_silu, const Tensor& dout,
                            const Tensor& dfinal_state, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dinitial_state) {
  check_args("causal_conv1d_backward", {&x, &weight, &dout, &dx, &dweight});
  for (const Tensor* t : {&initial_state, &dfinal_state, &dinitial_state})
    if (t->defined()) check_on_device("causal_conv1d_backward", "state", *t);
  launch::ConvBackwardArgs a{};
  a.T = x.dim(0);
  a.C = x.dim(1);
  a.W = weight.dim(1);
  if (a.C == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (a.T + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch dpre(static_cast<size_t>(a.T * a.C) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * a.C * a.W) * sizeof(float), s);
  a.x = f(x);
  a.weight = f(weight);
  a.s0 = initial_state.defined() ? f(initial_state) : nullptr;
  a.dout = f(dout);
  a.dfin = dfinal_state.defined() ? f(dfinal_state) : nullptr;
  a.dx = fm(dx);
  a.dweight = fm(dweight);
  a.ds0 = dinitial_state.defined() ? fm(dinitial_state) : nullptr;
  a.dpre = static_cast<float*>(dpre.get());
  a.partials = static_cast<float*>(partials.get());
  a.silu = apply_silu;
  launch::causal_conv1d_backward(s, a);
}

// Elementwise gradients into d_f and a scratch d_A_log per element; the parameter gradients are
// column sums over tokens in fixed chunks (as column_sums), then d_A_log's columns head by head.
void kda_gate_backward(const Exec& ex, const Tensor& gate_in, const Tensor& A_log,
                       const Tensor& dt_bias, float lower_bound, const Tensor& d_g,
                       const Tensor& d_f, const Tensor& d_A_log, const Tensor& d_dt_bias) {
  check_args("kda_gate_backward", {&gate_in, &A_log, &d_g, &d_f, &d_A_log});
  if (dt_bias.defined()) check_args("kda_gate_backward", {&dt_bias, &d_dt_bias});
  const int64_t T = gate_in.dim(0), width = gate_in.dim(1), H = A_log.numel();
  if (T == 0 || width == 0) return;
  cudaStream_t s = stream_of(ex);
  const int64_t chunks = (T + launch::kColumnSumRows - 1) / launch::kColumnSumRows;
  Scratch d_alog(static_cast<size_t>(T * width) * sizeof(float), s);
  Scratch da_col(static_cast<size_t>(width) * sizeof(float), s);
  Scratch partials(static_cast<size_t>(chunks * width) * sizeof(float), s);
  float* dal = static_cast<float*>(d_alog.get());
  float* cols = static_cast<float*>(da_col.get());
  float* part = static_cast<float*>(partials.get());
  launch::kda_gate_grads(s, f(gate_in), f(A_log), dt_bias.defined() ? f(dt_bias) : nullptr,
                         lower_bound, f(d_g), T, width, H, fm(d_f), dal);
  if (dt_bias.defined())
    launch::column_sums(s, f(d_f), nullptr, nullptr, T, width, part, fm(d_dt_bias));
  LOOM_CUDA_CHECK(cudaMemsetAsync(cols, 0, static_cast<size_t>(width) * sizeof(float), s));
  launch::column_sums(s, dal, nullptr, nullptr, T, width, part, cols);
  launch::group_sums(s, cols, H, width / H, fm(d_A_log));
}

void scatter_add_rows(const Exec& ex, const char* op, const Tensor& src, const Tensor& ids,
                      const Tensor& dst) {
  check_args(op, {&src, &dst});
  const int64_t n = src.dim(0), c = src.dim(1), rows = dst.dim(0);
  if (n == 0) return;
  cudaStream_t s = stream_of(ex);
  // The ids come to the host (they are checked there, and sorted there: a trainer's step has a
  // few thousand of them).
  std::vector<int64_t> id(static_cast<size_t>(n));
  const bool i32 = ids.dtype() == DType::kI32;
  std::vector<int32_t> id32(i32 ? static_cast<size_t>(n) : 0);
  void* host = i32 ? static_cast<void*>(id32.data()) : static_cast<void*>(id.data());
  if (ids.device().is_cpu()) {
    std::copy_n(static_cast<const char*>(ids.raw()), ids.nbytes(), static_cast<char*>(host));
  } else {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host, ids.raw(), ids.nbytes(), cudaMemcpyDeviceToHost, s));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  if (i32) std::copy(id32.begin(), id32.end(), id.begin());
  for (int64_t i = 0; i < n; ++i) {
    LOOM_CHECK(id[i] >= 0 && id[i] < rows, "%s: ids[%lld] = %lld outside [0, %lld)", op,
               static_cast<long long>(i), static_cast<long long>(id[i]),
               static_cast<long long>(rows));
  }
  if (c == 0) return;
  // Sources stably sorted by target row, cut into one segment per target row.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  std::vector<int64_t> seg_begin, seg_row;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || id[perm[k]] != id[perm[k - 1]]) {
      seg_begin.push_back(k);
      seg_row.push_back(id[perm[k]]);
    }
  }
  const int64_t segments = static_cast<int64_t>(seg_row.size());
  seg_begin.push_back(n);
  std::vector<int64_t> packed;  // perm, seg_begin, seg_row in one upload
  packed.reserve(perm.size() + seg_begin.size() + seg_row.size());
  packed.insert(packed.end(), perm.begin(), perm.end());
  packed.insert(packed.end(), seg_begin.begin(), seg_begin.end());
  packed.insert(packed.end(), seg_row.begin(), seg_row.end());
  Scratch dev(packed.size() * sizeof(int64_t), s);
  dev.upload(packed.data(), packed.size() * sizeof(int64_t));
  const int64_t* p = static_cast<const int64_t*>(dev.get());
  launch::scatter_add_segments(s, f(src), p, p + n, p + n + segments + 1, segments, c, fm(dst));
}

}  // namespace loom::cuda
