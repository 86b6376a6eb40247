// The CUDA-core varlen attention kernel (see attention_simt.cu for the design), shared by the
// files that instantiate it: attention_simt_f32.cu, attention_simt_bf16.cu and
// attention_simt_fp8.cu (one per pool dtype, so that they compile in parallel).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"

namespace loom::cuda::simt {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeys = 32;                  // keys per tile (one per lane)
constexpr int kPerKey = kThreads / kKeys;  // threads loading one key row

struct SimtParams {
  launch::AttnArgs a;
  int dk_pad;  // q and key rows: part 1 at 0, part 2 at off2, zeros up to dk_pad
  int off2;
  int dks;     // key row stride in shared memory (elements)
  int dvs;     // value row stride (elements; separate values only)
  int stages;  // key tiles in flight
  int nh;      // heads per item
  int htpg;    // head tiles per group
  int units;   // units per item: groups * htpg
  bool vec;    // 16-byte copies (every row and offset 16-byte aligned); fp8 pools: 4-byte words
               // (every vector a whole number of words, rows and pools 4-byte aligned)
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float load_act(const void* p, int64_t i, bool is_bf16) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i])
                 : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_act(void* p, int64_t i, float x, bool is_bf16) {
  if (is_bf16) {
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<float*>(p)[i] = x;
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16 bytes of a key row as floats.
__device__ __forceinline__ void load16(const float* p, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
__device__ __forceinline__ void load16(const bf16* p, float (&x)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// An fp8 vector's scale, the 4 bytes at p (aligned: one load).
__device__ __forceinline__ float fp8_scale(const uint8_t* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const float*>(p);
  return __uint_as_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Blocks per multiprocessor to fit in registers: one query vector a warp (the decode layout,
// latency-bound: more blocks keep more loads in flight) leaves room for two or three; four
// (prefill and MLA, compute-bound) take the whole register file.
constexpr int min_blocks(int qpw, int cpt) { return qpw > 1 ? 1 : (cpt <= 4 ? 3 : 2); }

// KT: the element type of the tiles in shared memory (the pools' dtype; F8: fp8 pools, whose
// vectors are dequantized into f32 tiles as they are loaded, synchronously).
template <typename KT, int QPW, int CPT, bool VSEP, bool F8 = false>
__global__ void __launch_bounds__(kThreads, min_blocks(QPW, CPT))
    attn_simt_kernel(const SimtParams P) {
  static_assert(!F8 || sizeof(KT) == 4, "fp8 pools dequantize into f32 tiles");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int QV = kWarps * QPW;
  constexpr int E = 16 / static_cast<int>(sizeof(KT));  // elements per 16-byte copy
  const launch::AttnArgs& a = P.a;
  float* q_s = reinterpret_cast<float*>(smem_raw);       // [QV][dk_pad]
  KT* k_s = reinterpret_cast<KT*>(q_s + QV * P.dk_pad);  // [stages][kKeys][dks]
  KT* v_s = k_s + P.stages * kKeys * P.dks;              // [stages][kKeys][dvs]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Zero the tiles once: padding columns stay zero and rows never loaded read as zeros, so a
  // masked key (weight 0) never multiplies a non-finite value.
  {
    const int bytes =
        P.stages * kKeys * (P.dks + (VSEP ? P.dvs : 0)) * static_cast<int>(sizeof(KT));
    uint32_t* z = reinterpret_cast<uint32_t*>(k_s);
    for (int i = tid; i < bytes / 4; i += kThreads) z[i] = 0u;
  }

  const int rep = a.heads / a.groups;
  const float sl = a.scale * 1.4426950408889634f;  // scores in log2 units
  const int64_t total = static_cast<int64_t>(a.sched.counts[0]) * P.units;
  const int kk = tid / kPerKey, sub = tid % kPerKey;  // the key row this thread loads
  const int vstride = VSEP ? P.dvs : P.dks;

  for (int64_t u = blockIdx.x; u < total; u += gridDim.x) {
    const int4 it = reinterpret_cast<const int4*>(a.sched.items)[u / P.units];
    const int unit = static_cast<int>(u % P.units);
    const int g = unit / P.htpg;
    const int hb = g * rep + (unit % P.htpg) * P.nh;
    const int he = min(hb + P.nh, (g + 1) * rep);
    const int seq = it.x, nrows = it.z, split = it.w;
    const int64_t row0 = it.y;
    const int64_t chunk = a.sched.seq_chunk[seq];
    const int64_t L_last = a.past[seq] + (row0 + nrows - a.cu[seq]);
    const int64_t kb = chunk > 0 ? split * chunk : 0;
    const int64_t ke = chunk > 0 ? min(L_last, kb + chunk) : L_last;
    const int ntiles = static_cast<int>((ke - kb + kKeys - 1) / kKeys);

    int64_t ke_r[QPW];
    bool ok_r[QPW];
#pragma unroll
    for (int r = 0; r < QPW; ++r) {
      const int qv = warp * QPW + r, rl = qv / P.nh, hl = qv % P.nh;
      ok_r[r] = rl < nrows && hb + hl < he;
      ke_r[r] = min(L_last - (nrows - 1 - rl), ke);
    }

    __syncthreads();  // the previous unit is done with q_s and the tiles
    for (int e = tid; e < QV * P.dk_pad; e += kThreads) {
      const int qv = e / P.dk_pad, c = e % P.dk_pad;
      const int rl = qv / P.nh, hl = qv % P.nh;
      float x = 0.0f;
      if (rl < nrows && hb + hl < he) {
        const int64_t base = (row0 + rl) * a.q_row + static_cast<int64_t>(hb + hl) * a.q_head;
        if (c < a.d1) {
          x = load_act(a.q, base + c, a.q_bf16);
        } else if (c >= P.off2 && c < P.off2 + a.d2) {
          x = load_act(a.q, base + a.d1 + (c - P.off2), a.q_bf16);
        }
      }
      q_s[e] = x;
    }

    // Pool row of this thread's key in tile t (-1: past the range, or a page outside the pool).
    auto pool_row = [&](int t) -> int64_t {
      const int64_t pos = kb + static_cast<int64_t>(t) * kKeys + kk;
      if (t >= ntiles || pos >= ke) return -1;
      // 32-bit division: positions and page sizes fit (checked on the host); 64-bit division
      // is a long instruction sequence on the GPU, paid per thread and tile.
      const uint32_t p32 = static_cast<uint32_t>(pos), ps32 = static_cast<uint32_t>(a.page_size);
      const uint32_t page = p32 / ps32;
      const int64_t pid = a.page_table[seq * a.max_pages + page];
      if (pid < 0 || pid >= a.num_pages) return -1;
      return pid * a.page_size + (p32 - page * ps32);
    };
    auto issue = [&](int t, int64_t prow) {
      if (prow < 0 || (a.probe == 1 && t > 0)) return;
      const int st = t % P.stages;
      KT* kd = k_s + (st * kKeys + kk) * P.dks;
      KT* vd = v_s + (st * kKeys + kk) * P.dvs;
      if constexpr (F8) {
        // Plain loads, each value f32(code) * scale as the host's dequantization; the store to
        // shared memory waits for them (no cp.async: the bytes change on the way).
        const uint8_t* b1 = static_cast<const uint8_t*>(a.k1) + prow * a.k1_row +
                            static_cast<int64_t>(g) * (a.d1 + 4);
        const uint8_t* b2 = static_cast<const uint8_t*>(a.k2) + prow * a.k2_row +
                            static_cast<int64_t>(g) * (a.d2 + 4);
        const uint8_t* b3 = VSEP ? static_cast<const uint8_t*>(a.v) + prow * a.v_row +
                                       static_cast<int64_t>(g) * (a.dv + 4)
                                 : nullptr;
        const float sc1 = fp8_scale(b1 + a.d1, P.vec);
        const float sc2 = a.d2 > 0 ? fp8_scale(b2 + a.d2, P.vec) : 0.0f;
        const float sc3 = VSEP ? fp8_scale(b3 + a.dv, P.vec) : 0.0f;
        if (P.vec) {
          const int c1 = a.d1 / 4, c2 = a.d2 / 4, c3 = VSEP ? a.dv / 4 : 0;
          for (int c = sub; c < c1 + c2 + c3; c += kPerKey) {
            float4 x;
            float* d;
            if (c < c1) {
              x = dev::kv_fp8_word(reinterpret_cast<const uint32_t*>(b1)[c], sc1);
              d = kd + 4 * c;
            } else if (c < c1 + c2) {
              x = dev::kv_fp8_word(reinterpret_cast<const uint32_t*>(b2)[c - c1], sc2);
              d = kd + P.off2 + 4 * (c - c1);
            } else {
              x = dev::kv_fp8_word(reinterpret_cast<const uint32_t*>(b3)[c - c1 - c2], sc3);
              d = vd + 4 * (c - c1 - c2);
            }
            *reinterpret_cast<float4*>(d) = x;
          }
        } else {
          const int n3 = VSEP ? a.dv : 0;
          for (int c = sub; c < a.d1 + a.d2 + n3; c += kPerKey) {
            if (c < a.d1) {
              kd[c] = dev::kv_fp8_value(b1[c], sc1);
            } else if (c < a.d1 + a.d2) {
              kd[P.off2 + c - a.d1] = dev::kv_fp8_value(b2[c - a.d1], sc2);
            } else {
              vd[c - a.d1 - a.d2] = dev::kv_fp8_value(b3[c - a.d1 - a.d2], sc3);
            }
          }
        }
        return;
      }
      const KT* s1 =
          static_cast<const KT*>(a.k1) + prow * a.k1_row + static_cast<int64_t>(g) * a.d1;
      const KT* s2 =
          static_cast<const KT*>(a.k2) + prow * a.k2_row + static_cast<int64_t>(g) * a.d2;
      const KT* s3 =
          VSEP ? static_cast<const KT*>(a.v) + prow * a.v_row + static_cast<int64_t>(g) * a.dv
               : nullptr;
      if (P.vec) {
        const int c1 = a.d1 / E, c2 = a.d2 / E, c3 = VSEP ? a.dv / E : 0;
        for (int c = sub; c < c1 + c2 + c3; c += kPerKey) {
          if (c < c1) {
            cp_async16(kd + c * E, s1 + c * E);
          } else if (c < c1 + c2) {
            cp_async16(kd + P.off2 + (c - c1) * E, s2 + (c - c1) * E);
          } else {
            cp_async16(vd + (c - c1 - c2) * E, s3 + (c - c1 - c2) * E);
          }
        }
      } else {
        const int n3 = VSEP ? a.dv : 0;
        for (int c = sub; c < a.d1 + a.d2 + n3; c += kPerKey) {
          if (c < a.d1) {
            kd[c] = s1[c];
          } else if (c < a.d1 + a.d2) {
            kd[P.off2 + c - a.d1] = s2[c - a.d1];
          } else {
            vd[c - a.d1 - a.d2] = s3[c - a.d1 - a.d2];
          }
        }
      }
    };

    float m[QPW], l[QPW], acc[QPW][CPT];
#pragma unroll
    for (int r = 0; r < QPW; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
#pragma unroll
      for (int c = 0; c < CPT; ++c) acc[r][c] = 0.0f;
    }

    int64_t pre = pool_row(0);
    issue(0, pre);
    cp_commit();
    pre = pool_row(1);
    for (int i = 0; i < ntiles; ++i) {
      if (P.stages == 2) {
        issue(i + 1, pre);  // into the stage tile i - 1 used (released by the last barrier)
        cp_commit();
        pre = pool_row(i + 2);
        cp_wait<1>();
      } else {
        cp_wait<0>();
      }
      __syncthreads();     // tile i (and, at i = 0, q_s) visible to every thread
      if (a.probe == 2) {  // benchmarks: the loads and barriers alone
        __syncthreads();
        if (P.stages == 1 && i + 1 < ntiles) {
          issue(i + 1, pre);
          cp_commit();
          pre = pool_row(i + 2);
        }
        continue;
      }

      const int st = i % P.stages;
      const KT* ks = k_s + st * kKeys * P.dks;
      const KT* vs = VSEP ? v_s + st * kKeys * P.dvs : ks;
      // Scores: lane = key.
      float s[QPW];
#pragma unroll
      for (int r = 0; r < QPW; ++r) s[r] = 0.0f;
      const KT* krow = ks + lane * P.dks;
      const float* qw = q_s + warp * QPW * P.dk_pad;
#pragma unroll 2
      for (int c = 0; c < P.dk_pad; c += E) {
        float kx[E];
        load16(krow + c, kx);
#pragma unroll
        for (int r = 0; r < QPW; ++r) {
          const float* qr = qw + r * P.dk_pad + c;
#pragma unroll
          for (int e = 0; e < E; e += 4) {
            const float4 x = *reinterpret_cast<const float4*>(qr + e);
            float t = s[r];
            t = fmaf(x.x, kx[e], t);
            t = fmaf(x.y, kx[e + 1], t);
            t = fmaf(x.z, kx[e + 2], t);
            s[r] = fmaf(x.w, kx[e + 3], t);
          }
        }
      }
      // Online softmax (log2 units).
      const int64_t pos = kb + static_cast<int64_t>(i) * kKeys + lane;
#pragma unroll
      for (int r = 0; r < QPW; ++r) {
        const float x = pos < ke_r[r] ? s[r] * sl : -INFINITY;
        const float mn = fmaxf(m[r], warp_max(x));
        const float base = mn == -INFINITY ? 0.0f : mn;
        const float alpha = exp2f(m[r] - base);
        const float p = exp2f(x - base);
        l[r] = fmaf(l[r], alpha, dev::warp_sum(p));
        m[r] = mn;
        if (alpha != 1.0f) {  // the same for every lane; 1 once the max settles (exact to skip)
#pragma unroll
          for (int c = 0; c < CPT; ++c) acc[r][c] *= alpha;
        }
        s[r] = p;
      }
      // Values: lane = column.
#pragma unroll 4
      for (int j = 0; j < kKeys; ++j) {
        float pj[QPW];
#pragma unroll
        for (int r = 0; r < QPW; ++r) pj[r] = __shfl_sync(0xffffffffu, s[r], j);
        const KT* vr = vs + j * vstride;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int col = lane + 32 * c;
          const float v = col < a.dv ? to_f(vr[col]) : 0.0f;
#pragma unroll
          for (int r = 0; r < QPW; ++r) acc[r][c] = fmaf(pj[r], v, acc[r][c]);
        }
      }
      __syncthreads();  // every warp is done with this stage
      if (P.stages == 1 && i + 1 < ntiles) {
        issue(i + 1, pre);
        cp_commit();
        pre = pool_row(i + 2);
      }
    }
    cp_wait<0>();

#pragma unroll
    for (int r = 0; r < QPW; ++r) {
      if (!ok_r[r] || ke_r[r] <= kb) continue;
      const int qv = warp * QPW + r;
      const int64_t row = row0 + qv / P.nh;
      const int head = hb + qv % P.nh;
      const int ns = a.sched.row_nsplit[row];
      if (ns <= 1) {
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int col = lane + 32 * c;
          if (col < a.dv)
            store_act(a.o, row * a.o_row + head * a.o_head + col, acc[r][c] / l[r], a.o_bf16);
        }
      } else {
        const int64_t slot = static_cast<int64_t>(a.sched.row_part[row]) + split;
        float* dst = a.part_acc + (slot * a.heads + head) * a.dv;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
          const int col = lane + 32 * c;
          if (col < a.dv) dst[col] = acc[r][c];
        }
        if (lane == 0) {
          a.part_ml[(slot * a.heads + head) * 2] = m[r];
          a.part_ml[(slot * a.heads + head) * 2 + 1] = l[r];
        }
      }
    }
  }
}

inline int cpt_for(int dv) {
  if (dv <= 32) return 1;
  if (dv <= 128) return 4;
  if (dv <= 256) return 8;
  return dv <= 512 ? 16 : 0;
}

template <typename KT, int QPW, int CPT, bool VSEP, bool F8>
void launch_kernel(cudaStream_t stream, const SimtParams& P, size_t smem, int64_t max_items) {
  auto kernel = attn_simt_kernel<KT, QPW, CPT, VSEP, F8>;
  int64_t blocks = max_items * P.units;
  const int64_t cap =
      launch::resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, smem);
  if (blocks > cap) blocks = cap;
  if (blocks < 1) return;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(P);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <typename KT, bool VSEP, int QPW, bool F8>
void dispatch_cpt(cudaStream_t stream, const SimtParams& P, size_t smem, int64_t max_items) {
  switch (cpt_for(P.a.dv)) {
    case 1:
      return launch_kernel<KT, QPW, 1, VSEP, F8>(stream, P, smem, max_items);
    case 4:
      return launch_kernel<KT, QPW, 4, VSEP, F8>(stream, P, smem, max_items);
    case 8:
      return launch_kernel<KT, QPW, 8, VSEP, F8>(stream, P, smem, max_items);
    default:
      return launch_kernel<KT, QPW, 16, VSEP, F8>(stream, P, smem, max_items);
  }
}

template <typename KT, bool F8 = false>
void dispatch(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items) {
  if (P.a.v == nullptr) {  // MLA: values are the latent; always four vectors a warp
    return dispatch_cpt<KT, false, 4, F8>(stream, P, smem, max_items);
  }
  if (qpw == 1) return dispatch_cpt<KT, true, 1, F8>(stream, P, smem, max_items);
  return dispatch_cpt<KT, true, 4, F8>(stream, P, smem, max_items);
}

// dispatch<float>, dispatch<bf16> and dispatch<float, true> (fp8 pools), each in its own file.
void launch_f32(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items);
void launch_bf16(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items);
void launch_fp8(cudaStream_t stream, const SimtParams& P, int qpw, size_t smem, int64_t max_items);

}  // namespace loom::cuda::simt
