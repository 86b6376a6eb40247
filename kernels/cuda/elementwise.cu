// Elementwise kernels (kernels/elementwise.h and silu_mul / embedding of kernels/activation.h):
// grid-stride loops over int64 indices. Activation arrays are each f32 or bf16 (kernel templates
// on the element types, arithmetic in f32); parameters (the bias) are f32. The pointwise ops, the
// hot ones, move 16-byte units (dev::kVecWidth elements) when every pointer is 16-byte aligned.
#include <type_traits>

#include "kernels/cuda/bf16_io.cuh"

namespace loom::cuda {
namespace {

template <launch::Unary kOp>
__device__ __forceinline__ float apply(float a, float b) {
  if constexpr (kOp == launch::Unary::kAdd) {
    return a + b;
  } else if constexpr (kOp == launch::Unary::kMulSigmoid) {
    return a * dev::sigmoid(b);
  } else if constexpr (kOp == launch::Unary::kMulSilu) {
    return a * dev::silu(b);
  } else if constexpr (kOp == launch::Unary::kSigmoid) {
    return dev::sigmoid(a);
  } else {  // kSiluMul
    return dev::silu(a) * b;
  }
}

// r = apply(x, y) into x (or `out` for kSiluMul) over units of V elements, then the n % V
// elements after the last whole unit one per thread of block 0. y is unused by kSigmoid.
template <launch::Unary kOp, typename X, typename Y, typename O, int V>
__global__ void pointwise_kernel(X* x, const Y* y, O* out, int64_t n) {
  constexpr bool kUsesY = kOp != launch::Unary::kSigmoid;
  const int64_t units = n / V;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float a[V], b[V] = {};
    dev::ld_vec<V>(x + u * V, a);
    if constexpr (kUsesY) dev::ld_vec<V>(y + u * V, b);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = apply<kOp>(a[j], b[j]);
    if constexpr (kOp == launch::Unary::kSiluMul) {
      dev::st_vec<V>(out + u * V, a);
    } else {
      dev::st_vec<V>(x + u * V, a);
    }
  }
  const int64_t i = units * V + threadIdx.x;
  if (V > 1 && blockIdx.x == 0 && i < n) {
    const float r = apply<kOp>(dev::ld(x + i), kUsesY ? dev::ld(y + i) : 0.0f);
    if constexpr (kOp == launch::Unary::kSiluMul) {
      dev::st(out + i, r);
    } else {
      dev::st(x + i, r);
    }
  }
}

template <typename X>
__global__ void add_bias_kernel(X* x, const float* __restrict__ b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dev::st(x + i, dev::ld(x + i) + b[i % cols]);
}

template <typename X, typename G>
__global__ void mul_sigmoid_rows_kernel(X* x, const G* __restrict__ g, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dev::st(x + i, dev::ld(x + i) * (1.0f / (1.0f + expf(-dev::ld(g + i / cols)))));
}

// A 2-D copy between arrays of different element types (same types go to cudaMemcpy2DAsync).
template <typename S, typename D>
__global__ void convert_2d_kernel(D* __restrict__ dst, int64_t dst_ld, const S* __restrict__ src,
                                  int64_t src_ld, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dev::st(dst + r * dst_ld + c, dev::ld(src + r * src_ld + c));
  }
}

// One block per output row; a bad id writes zeros (never reads or writes out of bounds).
template <typename Id, typename S, typename O>
__global__ void gather_kernel(const Id* __restrict__ ids, const S* __restrict__ table,
                              O* __restrict__ out, int64_t V, int64_t d, int32_t* bad) {
  const int64_t row = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[row]);
  O* o = out + row * d;
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0 && bad != nullptr) atomicMin(bad, static_cast<int32_t>(row));
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dev::st(o + i, 0.0f);
    return;
  }
  const S* src = table + id * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dev::st(o + i, dev::ld(src + i));
}

__global__ void fill_or_scale_kernel(float* x, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = beta == 0.0f ? 0.0f : beta * x[i];
}

constexpr int kThreads = 256;

template <launch::Unary kOp, typename X, typename Y, typename O>
void launch_pointwise(cudaStream_t stream, void* x, const void* y, void* out, int64_t n) {
  constexpr bool kUsesY = kOp != launch::Unary::kSigmoid;
  constexpr bool kUsesOut = kOp == launch::Unary::kSiluMul;
  constexpr int kV = kUsesOut ? dev::kVecWidth<X, Y, O> : dev::kVecWidth<X, Y>;
  X* xp = static_cast<X*>(x);
  const Y* yp = static_cast<const Y*>(y);
  O* op = static_cast<O*>(out);
  const bool vec =
      dev::aligned16(x) && (!kUsesY || dev::aligned16(y)) && (!kUsesOut || dev::aligned16(out));
  if (vec) {
    const unsigned grid = dev::grid_for(n / kV, kThreads);
    pointwise_kernel<kOp, X, Y, O, kV><<<grid, kThreads, 0, stream>>>(xp, yp, op, n);
  } else {
    const unsigned grid = dev::grid_for(n, kThreads);
    pointwise_kernel<kOp, X, Y, O, 1><<<grid, kThreads, 0, stream>>>(xp, yp, op, n);
  }
}

template <typename Id>
void launch_gather(cudaStream_t stream, const Id* ids, const void* table, bool table_bf16,
                   void* out, bool out_bf16, int64_t n, int64_t V, int64_t d, int32_t* bad) {
  if (n == 0 || d == 0) return;
  LOOM_CHECK_GRID(n);
  const int threads = d >= 1024 ? 256 : (d >= 256 ? 128 : 64);
  dev::with_elem(table_bf16, [&](auto st) {
    dev::with_elem(out_bf16, [&](auto ot) {
      using S = typename decltype(st)::type;
      using O = typename decltype(ot)::type;
      gather_kernel<Id, S, O><<<static_cast<unsigned>(n), threads, 0, stream>>>(
          ids, static_cast<const S*>(table), static_cast<O*>(out), V, d, bad);
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace launch {

void pointwise(cudaStream_t stream, Unary op, void* x, bool x_bf16, const void* y, bool y_bf16,
               void* out, bool out_bf16, int64_t n) {
  if (n == 0) return;
  // Only the types an op reads or writes are dispatched on (the others stay float), which keeps
  // the instantiations to the combinations that can occur.
  dev::with_elem(x_bf16, [&](auto xt) {
    using X = typename decltype(xt)::type;
    if (op == Unary::kSigmoid)
      return launch_pointwise<Unary::kSigmoid, X, X, float>(stream, x, y, out, n);
    dev::with_elem(y_bf16, [&](auto yt) {
      using Y = typename decltype(yt)::type;
      switch (op) {
        case Unary::kAdd:
          return launch_pointwise<Unary::kAdd, X, Y, float>(stream, x, y, out, n);
        case Unary::kMulSigmoid:
          return launch_pointwise<Unary::kMulSigmoid, X, Y, float>(stream, x, y, out, n);
        case Unary::kMulSilu:
          return launch_pointwise<Unary::kMulSilu, X, Y, float>(stream, x, y, out, n);
        case Unary::kSiluMul:
          return dev::with_elem(out_bf16, [&](auto ot) {
            using O = typename decltype(ot)::type;
            launch_pointwise<Unary::kSiluMul, X, Y, O>(stream, x, y, out, n);
          });
        case Unary::kSigmoid:
          break;
      }
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void add_bias(cudaStream_t stream, void* x, bool x_bf16, const float* bias, int64_t rows,
              int64_t cols) {
  if (rows * cols == 0) return;
  dev::with_elem(x_bf16, [&](auto xt) {
    using X = typename decltype(xt)::type;
    add_bias_kernel<X><<<dev::grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(
        static_cast<X*>(x), bias, rows, cols);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void mul_sigmoid_rows(cudaStream_t stream, void* x, bool x_bf16, const void* gate, bool gate_bf16,
                      int64_t rows, int64_t cols) {
  if (rows * cols == 0) return;
  dev::with_elem(x_bf16, [&](auto xt) {
    dev::with_elem(gate_bf16, [&](auto gt) {
      using X = typename decltype(xt)::type;
      using G = typename decltype(gt)::type;
      mul_sigmoid_rows_kernel<X, G><<<dev::grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(
          static_cast<X*>(x), static_cast<const G*>(gate), rows, cols);
    });
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void copy_2d(cudaStream_t stream, void* dst, bool dst_bf16, int64_t dst_ld, const void* src,
             bool src_bf16, int64_t src_ld, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  if (dst_bf16 == src_bf16) {
    const size_t size = dst_bf16 ? 2 : 4;
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_ld * size, src, src_ld * size, cols * size, rows,
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dev::with_elem(src_bf16, [&](auto st) {
    using S = typename decltype(st)::type;
    using D = std::conditional_t<std::is_same_v<S, float>, dev::bf16, float>;
    convert_2d_kernel<S, D><<<dev::grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(
        static_cast<D*>(dst), dst_ld, static_cast<const S*>(src), src_ld, rows, cols);
  });
  LOOM_CUDA_CHECK_LAUNCH();
}

void gather_rows_i32(cudaStream_t stream, const int32_t* ids, const void* table, bool table_bf16,
                     void* out, bool out_bf16, int64_t n, int64_t V, int64_t d, int32_t* bad) {
  launch_gather(stream, ids, table, table_bf16, out, out_bf16, n, V, d, bad);
}

void gather_rows_i64(cudaStream_t stream, const int64_t* ids, const void* table, bool table_bf16,
                     void* out, bool out_bf16, int64_t n, int64_t V, int64_t d, int32_t* bad) {
  launch_gather(stream, ids, table, table_bf16, out, out_bf16, n, V, d, bad);
}

void fill_or_scale(cudaStream_t stream, float* x, int64_t n, float beta) {
  if (n == 0) return;
  fill_or_scale_kernel<<<dev::grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, beta);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
