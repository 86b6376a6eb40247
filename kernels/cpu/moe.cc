#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gemm.h"

namespace loom::cpu {
namespace {

// Indices of the k largest values, by descending value, ties towards the lower index.
void top_k_indices(const float* v, int n, int k, int* idx_scratch, int* out) {
  std::iota(idx_scratch, idx_scratch + n, 0);
  std::partial_sort(idx_scratch, idx_scratch + k, idx_scratch + n,
                    [v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx_scratch, idx_scratch + k, out);
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& bias, const RouterParams& params,
               const Tensor& expert_ids, const Tensor& weights) {
  LOOM_CHECK_F32(logits);
  LOOM_CHECK(logits.ndim() == 2, "moe_route: logits %s", logits.describe().c_str());
  const int64_t t = logits.dim(0);
  const int e = static_cast<int>(logits.dim(1));
  const int k = params.top_k;
  const int ng = params.n_group;
  const int kg = params.topk_group;
  LOOM_CHECK(ng >= 1 && e % ng == 0 && kg >= 1 && kg <= ng,
             "moe_route: E=%d n_group=%d topk_group=%d", e, ng, kg);
  const int gsize = e / ng;
  LOOM_CHECK(ng == 1 || gsize >= 2, "moe_route: groups of %d experts (top-2 group score)", gsize);
  LOOM_CHECK(k >= 1 && k <= kg * gsize, "moe_route: top_k=%d with %d kept experts", k, kg * gsize);
  const bool has_bias = bias.defined();
  if (has_bias) {
    LOOM_CHECK_F32(bias);
    LOOM_CHECK_SHAPE(bias, e);
  }
  LOOM_CHECK(expert_ids.dtype() == DType::kI32 && expert_ids.is_contiguous(),
             "moe_route: expert_ids %s", expert_ids.describe().c_str());
  LOOM_CHECK_SHAPE(expert_ids, t, k);
  LOOM_CHECK_F32(weights);
  LOOM_CHECK_SHAPE(weights, t, k);
  const float* lp = logits.data<float>();
  const float* bp = has_bias ? bias.data<float>() : nullptr;
  int32_t* idp = expert_ids.data<int32_t>();
  float* wp = weights.data<float>();
  const bool sigmoid = params.score == RouterScore::kSigmoid;

#pragma omp parallel if (t * e > 16384)
  {
    std::vector<float> s(e), sel(e), gscore(ng);
    std::vector<int> scratch(e), chosen(k), gkept(kg);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < t; ++i) {
      const float* l = lp + i * e;
      if (sigmoid) {
        for (int j = 0; j < e; ++j) s[j] = 1.0f / (1.0f + std::exp(-l[j]));
      } else {
        // softmax in f32 (torch: F.softmax(logits, dim=-1, dtype=float32)).
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < e; ++j) mx = std::max(mx, l[j]);
        float sum = 0.0f;
        for (int j = 0; j < e; ++j) {
          s[j] = std::exp(l[j] - mx);
          sum += s[j];
        }
        for (int j = 0; j < e; ++j) s[j] /= sum;
      }
      for (int j = 0; j < e; ++j) sel[j] = bp ? s[j] + bp[j] : s[j];
      if (ng > 1 && kg < ng) {
        // Group score: sum of the group's two largest selection scores (torch topk(2).sum()).
        for (int g = 0; g < ng; ++g) {
          const float* v = sel.data() + g * gsize;
          float a = -std::numeric_limits<float>::infinity(), b = a;  // a >= b
          for (int j = 0; j < gsize; ++j) {
            if (v[j] > a) {
              b = a;
              a = v[j];
            } else if (v[j] > b) {
              b = v[j];
            }
          }
          gscore[g] = a + b;
        }
        top_k_indices(gscore.data(), ng, kg, scratch.data(), gkept.data());
        std::vector<char> keep(ng, 0);  // small; ng <= E
        for (int g : gkept) keep[g] = 1;
        for (int g = 0; g < ng; ++g) {
          if (keep[g]) continue;
          std::fill(sel.begin() + g * gsize, sel.begin() + (g + 1) * gsize,
                    -std::numeric_limits<float>::infinity());
        }
      }
      top_k_indices(sel.data(), e, k, scratch.data(), chosen.data());
      float* w = wp + i * k;
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) {
        idp[i * k + j] = chosen[j];
        w[j] = s[chosen[j]];
        sum += w[j];
      }
      if (params.renormalize) {
        // HF: sigmoid routers divide by sum + 1e-20; the softmax router (Qwen2MoeTopKRouter,
        // used by qwen3_next) divides by the plain sum.
        const float denom = sigmoid ? sum + 1e-20f : sum;
        for (int j = 0; j < k; ++j) w[j] /= denom;
      }
      for (int j = 0; j < k; ++j) w[j] *= params.routed_scaling;
    }
  }
}

void moe_experts_forward(const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                         const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                         const Tensor& out) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(weights);
  LOOM_CHECK_F32(w_gate);
  LOOM_CHECK_F32(w_up);
  LOOM_CHECK_F32(w_down);
  LOOM_CHECK_F32(out);
  LOOM_CHECK(x.ndim() == 2 && w_gate.ndim() == 3 && expert_ids.ndim() == 2,
             "moe_experts_forward: x %s expert_ids %s w_gate %s", x.describe().c_str(),
             expert_ids.describe().c_str(), w_gate.describe().c_str());
  LOOM_CHECK(expert_ids.dtype() == DType::kI32 && expert_ids.is_contiguous(),
             "moe_experts_forward: expert_ids %s", expert_ids.describe().c_str());
  const int64_t t = x.dim(0), d = x.dim(1);
  const int64_t k = expert_ids.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  LOOM_CHECK_SHAPE(expert_ids, t, k);
  LOOM_CHECK_SHAPE(weights, t, k);
  LOOM_CHECK_SHAPE(w_gate, ne, inter, d);
  LOOM_CHECK_SHAPE(w_up, ne, inter, d);
  LOOM_CHECK_SHAPE(w_down, ne, d, inter);
  LOOM_CHECK_SHAPE(out, t, d);
  if (t == 0) return;
  const int32_t* ids = expert_ids.data<int32_t>();
  const float* wts = weights.data<float>();
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const int64_t slots = t * k;

  // Counting sort of the (token, i) slots by expert; slot order within an expert is ascending.
  std::vector<int64_t> start(ne + 1, 0);
  for (int64_t j = 0; j < slots; ++j) {
    const int32_t ex = ids[j];
    LOOM_CHECK(ex >= 0 && ex < ne, "moe_experts_forward: expert_ids[%d] = %d outside [0, %d)", j,
               ex, ne);
    ++start[ex + 1];
  }
  for (int64_t ex = 0; ex < ne; ++ex) start[ex + 1] += start[ex];
  std::vector<int64_t> pos_of_slot(slots), slot_at(slots);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t j = 0; j < slots; ++j) {
      const int64_t pos = fill[ids[j]]++;
      pos_of_slot[j] = pos;
      slot_at[pos] = j;
    }
  }

  // Gather the rows, then per expert: h = silu(xe @ Wg^T) * (xe @ Wu^T); y = h @ Wd^T. Experts
  // run one after another, each GEMM threaded by OpenBLAS: calling (pthreads) OpenBLAS from inside
  // an OpenMP region would oversubscribe the cores.
  std::vector<float> xs(static_cast<size_t>(slots * d));
#pragma omp parallel for schedule(static) if (slots * d > 65536)
  for (int64_t pos = 0; pos < slots; ++pos) {
    const float* src = xp + (slot_at[pos] / k) * d;
    std::copy(src, src + d, xs.data() + pos * d);
  }
  int64_t max_rows = 0;
  for (int64_t ex = 0; ex < ne; ++ex) max_rows = std::max(max_rows, start[ex + 1] - start[ex]);
  std::vector<float> g(static_cast<size_t>(max_rows * inter)), u(g.size());
  std::vector<float> ys(static_cast<size_t>(slots * d));
  const float* wg = w_gate.data<float>();
  const float* wu = w_up.data<float>();
  const float* wd = w_down.data<float>();
  for (int64_t ex = 0; ex < ne; ++ex) {
    const int64_t n = start[ex + 1] - start[ex];
    if (n == 0) continue;
    const float* xe = xs.data() + start[ex] * d;
    sgemm(false, true, n, inter, d, 1.0f, xe, d, wg + ex * inter * d, d, 0.0f, g.data(), inter);
    sgemm(false, true, n, inter, d, 1.0f, xe, d, wu + ex * inter * d, d, 0.0f, u.data(), inter);
    silu_mul(g.data(), u.data(), g.data(), n * inter);
    sgemm(false, true, n, d, inter, 1.0f, g.data(), inter, wd + ex * d * inter, inter, 0.0f,
          ys.data() + start[ex] * d, d);
  }

  // Combine per token in the order of its expert_ids columns: independent of thread count.
#pragma omp parallel for schedule(static) if (t * d > 32768)
  for (int64_t tok = 0; tok < t; ++tok) {
    float* o = op + tok * d;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = tok * k + i;
      const float w = wts[slot];
      const float* y = ys.data() + pos_of_slot[slot] * d;
      if (i == 0) {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] = w * y[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] += w * y[c];
      }
    }
    if (k == 0) std::fill(o, o + d, 0.0f);
  }
}

}  // namespace loom::cpu
