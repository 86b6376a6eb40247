// Loads and stores of activation arrays that hold f32 or bf16 (nvcc only). Kernels templated on
// the element type compute in f32: a bf16 load widens exactly, a bf16 store rounds to nearest
// even (as the host's f32_to_bf16), an f32 load or store is a plain access.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"

namespace loom::cuda::dev {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Elements per unit of the vectorised kernels: one 16-byte access of the narrowest type among Ts
// (8 when any is bf16, else 4); wider types take two accesses per unit.
template <typename... Ts>
inline constexpr int kVecWidth = ((sizeof(Ts) == 2) || ...) ? 8 : 4;

// v[0 .. V) = p[0 .. V) widened to f32. V = 1 is a scalar access; otherwise p is 16-byte aligned
// and V a multiple of 16 / sizeof(T).
template <int V>
__device__ __forceinline__ void ld_vec(const float* p, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = *p;
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + j);
      v[j] = q.x;
      v[j + 1] = q.y;
      v[j + 2] = q.z;
      v[j + 3] = q.w;
    }
  }
}

template <int V>
__device__ __forceinline__ void ld_vec(const bf16* p, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = __bfloat162float(*p);
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(p + j);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
        v[j + 2 * k] = f.x;
        v[j + 2 * k + 1] = f.y;
      }
    }
  }
}

// p[0 .. V) = v (rounded to bf16 where p is bf16); alignment as for ld_vec.
template <int V>
__device__ __forceinline__ void st_vec(float* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    *p = v[0];
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      *reinterpret_cast<float4*>(p + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
  }
}

template <int V>
__device__ __forceinline__ void st_vec(bf16* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    *p = __float2bfloat16_rn(v[0]);
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 8) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[j + 2 * k], v[j + 2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
      *reinterpret_cast<uint4*>(p + j) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Host-side dispatch from a launcher's dtype flag to a kernel template: calls
// f(Type<bf16>{}) or f(Type<float>{}); the callee reads the type as typename decltype(t)::type.
template <typename T>
struct Type {
  using type = T;
};
template <typename F>
void with_elem(bool is_bf16, F&& f) {
  if (is_bf16) {
    f(Type<bf16>{});
  } else {
    f(Type<float>{});
  }
}

}  // namespace loom::cuda::dev
