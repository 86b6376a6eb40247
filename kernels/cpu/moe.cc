#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/fp8_matrix.h"
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

// The router's scores of one row: sigmoid, or softmax in f32 (torch: F.softmax(logits, dim=-1,
// dtype=float32)). moe_route and moe_route_replay share it, so a replayed row whose experts are
// the row's own gets the same bits.
void router_scores(const float* l, int e, bool sigmoid, float* s) {
  if (sigmoid) {
    for (int j = 0; j < e; ++j) s[j] = 1.0f / (1.0f + std::exp(-l[j]));
    return;
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < e; ++j) mx = std::max(mx, l[j]);
  float sum = 0.0f;
  for (int j = 0; j < e; ++j) {
    s[j] = std::exp(l[j] - mx);
    sum += s[j];
  }
  for (int j = 0; j < e; ++j) s[j] /= sum;
}

// The gate weights of one row's chosen experts ids[0..k) from its scores s (no bias), summed in
// slot order.
void chosen_weights(const float* s, const int32_t* ids, const RouterParams& params, float* w) {
  const int k = params.top_k;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    w[j] = s[ids[j]];
    sum += w[j];
  }
  if (params.renormalize) {
    // HF: sigmoid routers divide by sum + 1e-20; the softmax router (Qwen2MoeTopKRouter,
    // used by qwen3_next) divides by the plain sum.
    const float denom = params.score == RouterScore::kSigmoid ? sum + 1e-20f : sum;
    for (int j = 0; j < k; ++j) w[j] /= denom;
  }
  for (int j = 0; j < k; ++j) w[j] *= params.routed_scaling;
}

void check_index_tensor(const Tensor& t, const char* op, const char* name) {
  LOOM_CHECK(t.dtype() == DType::kI32 && t.is_contiguous(), "%s: %s %s", op, name,
             t.describe().c_str());
}

// Checks the grouped GEMMs' offsets against r rows; returns the largest expert's row count.
int64_t checked_max_rows(const Tensor& offsets, int64_t ne, int64_t r, const char* op) {
  const int32_t* off = offsets.data<int32_t>();
  int64_t max_rows = 0;
  for (int64_t e = 0; e < ne; ++e) {
    LOOM_CHECK(off[0] >= 0 && off[e] <= off[e + 1] && off[e + 1] <= r,
               "%s: offsets[%d..%d] = %d, %d with %d rows", op, e, e + 1, off[e], off[e + 1], r);
    max_rows = std::max<int64_t>(max_rows, off[e + 1] - off[e]);
  }
  return max_rows;
}

// Checks that every row index of row_of_slot is -1 or in [0, r) and, when `distinct`, that no row
// is named twice (the backward ops below write rows in parallel), before anything is written.
void check_slot_rows(const Tensor& row_of_slot, int64_t r, bool distinct, const char* op) {
  const int32_t* rows = row_of_slot.data<int32_t>();
  std::vector<char> seen(distinct ? r : 0, 0);
  for (int64_t j = 0; j < row_of_slot.numel(); ++j) {
    LOOM_CHECK(rows[j] >= -1 && rows[j] < r, "%s: row_of_slot[%d] = %d of %d rows", op, j, rows[j],
               r);
    if (!distinct || rows[j] < 0) continue;
    LOOM_CHECK(!seen[rows[j]], "%s: row %d is named by two slots (the second: %d)", op, rows[j], j);
    seen[rows[j]] = 1;
  }
}

// silu_mul's backward (cpu::silu_mul_backward's formula on raw pointers): dg = dh * u * silu'(g),
// du = dh * silu(g). Element i is read before it is written: dg may alias dh.
void silu_mul_grad(const float* gate, const float* up, const float* dh, float* dg, float* du,
                   int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gate[i], ui = up[i], di = dh[i];
    const float s = 1.0f / (1.0f + std::exp(-gi));
    const float sn = 1.0f / (1.0f + std::exp(gi));  // 1 - s without its cancellation near s = 1
    dg[i] = di * ui * (s * (1.0f + gi * sn));
    du[i] = di * (gi * s);
  }
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
  check_index_tensor(expert_ids, "moe_route", "expert_ids");
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
      router_scores(lp + i * e, e, sigmoid, s.data());
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
      for (int j = 0; j < k; ++j) idp[i * k + j] = chosen[j];
      chosen_weights(s.data(), idp + i * k, params, wp + i * k);
    }
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the replayed ids (data) here, before anything
// is written.
void moe_route_replay(const Tensor& logits, const Tensor& replay_ids, const RouterParams& params,
                      const Tensor& expert_ids, const Tensor& weights, const Tensor& counts) {
  const int64_t t = logits.dim(0);
  const int e = static_cast<int>(logits.dim(1));
  const int k = params.top_k;
  const int32_t* rp = replay_ids.data<int32_t>();
  for (int64_t i = 0; i < t; ++i) {
    const int32_t* r = rp + i * k;
    if (r[0] < 0) continue;
    for (int j = 0; j < k; ++j) {
      LOOM_CHECK(r[j] >= 0 && r[j] < e, "moe_route_replay: replay_ids[%d, %d] = %d outside [0, %d)",
                 i, j, r[j], e);
      for (int m = 0; m < j; ++m)
        LOOM_CHECK(r[m] != r[j], "moe_route_replay: row %d names expert %d twice", i, r[j]);
    }
  }
  const float* lp = logits.data<float>();
  int32_t* idp = expert_ids.data<int32_t>();
  float* wp = weights.data<float>();
  int64_t replayed = 0, differing = 0;
#pragma omp parallel if (t * e > 16384) reduction(+ : replayed, differing)
  {
    std::vector<float> s(e);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < t; ++i) {
      const int32_t* r = rp + i * k;
      if (r[0] < 0) continue;
      int32_t* own = idp + i * k;
      for (int j = 0; j < k; ++j) differing += std::find(own, own + k, r[j]) == own + k;
      replayed += k;
      std::copy(r, r + k, own);
      router_scores(lp + i * e, e, params.score == RouterScore::kSigmoid, s.data());
      chosen_weights(s.data(), own, params, wp + i * k);
    }
  }
  counts.data<int64_t>()[0] = replayed;
  counts.data<int64_t>()[1] = differing;
}

// Shapes and dtypes are checked in kernels/moe.cc; the expert ids (data) here.
void moe_route_backward(const Tensor& logits, const Tensor& expert_ids, const RouterParams& params,
                        const Tensor& d_weights, const Tensor& d_logits) {
  const int64_t t = logits.dim(0);
  const int e = static_cast<int>(logits.dim(1));
  const int k = params.top_k;
  const int32_t* idp = expert_ids.data<int32_t>();
  for (int64_t j = 0; j < t * k; ++j)
    LOOM_CHECK(idp[j] >= 0 && idp[j] < e, "moe_route_backward: expert_ids[%d] = %d outside [0, %d)",
               j, idp[j], e);
  const float* lp = logits.data<float>();
  const float* dwp = d_weights.data<float>();
  float* dlp = d_logits.data<float>();
  const bool sigmoid = params.score == RouterScore::kSigmoid;
  const float c = params.routed_scaling;

#pragma omp parallel if (t * e > 16384)
  {
    std::vector<float> s(e), ds(e), da(k);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < t; ++i) {
      const float* l = lp + i * e;
      const int32_t* id = idp + i * k;
      const float* dw = dwp + i * k;
      float* dl = dlp + i * e;
      router_scores(l, e, sigmoid, s.data());  // as moe_route computes them
      // The gradient of the chosen scores a_j = s[id_j].
      if (params.renormalize) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += s[id[j]];
        const float denom = sigmoid ? sum + 1e-20f : sum;
        float dot = 0.0f;  // sum_j d_w_j * w_j
        for (int j = 0; j < k; ++j) dot += dw[j] * (s[id[j]] / denom * c);
        for (int j = 0; j < k; ++j) da[j] = (c * dw[j] - dot) / denom;
      } else {
        for (int j = 0; j < k; ++j) da[j] = c * dw[j];
      }
      std::fill(ds.begin(), ds.end(), 0.0f);
      for (int j = 0; j < k; ++j) ds[id[j]] += da[j];
      if (sigmoid) {
        // s * (1 - s), with 1 - s = sigmoid(-l) (no cancellation near s = 1).
        for (int j = 0; j < e; ++j)
          dl[j] = ds[j] == 0.0f ? 0.0f : ds[j] * (s[j] * (1.0f / (1.0f + std::exp(l[j]))));
      } else {
        float dot = 0.0f;  // sum(s * d_s) over the chosen experts (d_s is zero elsewhere)
        for (int j = 0; j < k; ++j) dot += s[id[j]] * da[j];
        for (int j = 0; j < e; ++j) dl[j] = s[j] * (ds[j] - dot);
      }
    }
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the expert ids (data) here.
void moe_aux_loss_forward_backward(const Tensor& logits, const Tensor& expert_ids,
                                   RouterScore score, float alpha, const Tensor& loss,
                                   const Tensor& d_logits) {
  const int64_t t = logits.dim(0);
  const int e = static_cast<int>(logits.dim(1));
  const int64_t slots = expert_ids.numel();
  const int32_t* idp = expert_ids.data<int32_t>();
  std::vector<int64_t> count(e, 0);
  for (int64_t j = 0; j < slots; ++j) {
    LOOM_CHECK(idp[j] >= 0 && idp[j] < e,
               "moe_aux_loss_forward_backward: expert_ids[%lld] = %d outside [0, %d)",
               static_cast<long long>(j), idp[j], e);
    ++count[idp[j]];
  }
  const float* lp = logits.data<float>();
  float* dlp = d_logits.data<float>();
  const bool sigmoid = score == RouterScore::kSigmoid;
  // p[t, :] (the normalised scores) and s = sigmoid(l) (sigmoid only) of one row, in f32 as the
  // router computes its scores; `inv` receives 1 / sum_j s_j (sigmoid) or 1.
  auto probs = [&](const float* l, float* p, float* s, float& inv) {
    if (sigmoid) {
      float sum = 0.0f;
      for (int j = 0; j < e; ++j) sum += (s[j] = 1.0f / (1.0f + std::exp(-l[j])));
      inv = 1.0f / sum;
      for (int j = 0; j < e; ++j) p[j] = s[j] * inv;
    } else {
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < e; ++j) mx = std::max(mx, l[j]);
      float sum = 0.0f;
      for (int j = 0; j < e; ++j) sum += (p[j] = std::exp(l[j] - mx));
      for (int j = 0; j < e; ++j) p[j] /= sum;
      inv = 1.0f;
    }
  };
  // dL/dp[t, e] = alpha * E * f_e / T, the same for every row.
  std::vector<float> c(e);
  const double scale = static_cast<double>(alpha) * e / (static_cast<double>(slots) * t);
  for (int j = 0; j < e; ++j) c[j] = static_cast<float>(scale * static_cast<double>(count[j]));
  // The loss, in one fixed order: sum_e c_e * sum_t p[t, e] = alpha E sum_e f_e P_e.
  {
    std::vector<float> p(e), s(e);
    std::vector<double> mass(e, 0.0);
    float inv = 1.0f;
    for (int64_t i = 0; i < t; ++i) {
      probs(lp + i * e, p.data(), s.data(), inv);
      for (int j = 0; j < e; ++j) mass[j] += p[j];
    }
    double sum = 0.0;
    for (int j = 0; j < e; ++j) sum += scale * static_cast<double>(count[j]) * mass[j];
    loss.data<float>()[0] = static_cast<float>(sum);
  }
#pragma omp parallel if (t * e > 16384)
  {
    std::vector<float> p(e), s(e), g(e);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < t; ++i) {
      const float* l = lp + i * e;
      float* dl = dlp + i * e;
      float inv = 1.0f;
      probs(l, p.data(), s.data(), inv);
      float dot = 0.0f;  // sum_e p_e c_e
      for (int j = 0; j < e; ++j) dot += p[j] * c[j];
      if (sigmoid) {
        // s (1 - s), with 1 - s = sigmoid(-l) (no cancellation near s = 1).
        for (int j = 0; j < e; ++j)
          g[j] = (c[j] - dot) * inv * (s[j] * (1.0f / (1.0f + std::exp(l[j]))));
      } else {
        for (int j = 0; j < e; ++j) g[j] = p[j] * (c[j] - dot);
      }
      // Added as finished values: in the loops above the compiler would fuse the last product
      // with this sum (FMA), and d_logits would then depend on what it held before.
      for (int j = 0; j < e; ++j) dl[j] += g[j];
    }
  }
}

void moe_permute(const Tensor& x, const Tensor& expert_ids, int64_t first_expert,
                 int64_t num_experts, const Tensor& offsets, const Tensor& row_of_slot,
                 const Tensor& x_sorted) {
  LOOM_CHECK_F32(x);
  LOOM_CHECK_F32(x_sorted);
  check_index_tensor(expert_ids, "moe_permute", "expert_ids");
  check_index_tensor(offsets, "moe_permute", "offsets");
  check_index_tensor(row_of_slot, "moe_permute", "row_of_slot");
  LOOM_CHECK(x.ndim() == 2 && expert_ids.ndim() == 2 && offsets.ndim() == 1 && x_sorted.ndim() == 2,
             "moe_permute: x %s expert_ids %s offsets %s x_sorted %s", x.describe().c_str(),
             expert_ids.describe().c_str(), offsets.describe().c_str(),
             x_sorted.describe().c_str());
  const int64_t t = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  const int64_t ne = offsets.dim(0) - 1;
  LOOM_CHECK_SHAPE(expert_ids, t, k);
  LOOM_CHECK_SHAPE(row_of_slot, t, k);
  LOOM_CHECK(ne >= 0 && first_expert >= 0 && first_expert + ne <= num_experts,
             "moe_permute: experts [%d, %d) of %d", first_expert, first_expert + ne, num_experts);
  LOOM_CHECK(x_sorted.dim(1) == d, "moe_permute: x %s x_sorted %s", x.describe().c_str(),
             x_sorted.describe().c_str());
  const int64_t slots = t * k;
  LOOM_CHECK(slots <= std::numeric_limits<int32_t>::max(), "moe_permute: %d slots overflow i32",
             slots);
  const int32_t* ids = expert_ids.data<int32_t>();
  int32_t* off = offsets.data<int32_t>();
  int32_t* rows = row_of_slot.data<int32_t>();

  // Counting sort of the owned slots by expert, slots ascending within an expert.
  std::fill(off, off + ne + 1, 0);
  for (int64_t j = 0; j < slots; ++j) {
    const int64_t e = ids[j];
    LOOM_CHECK(e >= 0 && e < num_experts, "moe_permute: expert_ids[%d] = %d outside [0, %d)", j, e,
               num_experts);
    if (e >= first_expert && e < first_expert + ne) ++off[e - first_expert + 1];
  }
  for (int64_t e = 0; e < ne; ++e) off[e + 1] += off[e];
  LOOM_CHECK(off[ne] <= x_sorted.dim(0), "moe_permute: %d rows kept, x_sorted %s", off[ne],
             x_sorted.describe().c_str());
  std::vector<int32_t> next(off, off + ne);
  for (int64_t j = 0; j < slots; ++j) {
    const int64_t e = ids[j] - first_expert;
    rows[j] = e >= 0 && e < ne ? next[e]++ : -1;
  }

  const float* xp = x.data<float>();
  float* xs = x_sorted.data<float>();
#pragma omp parallel for schedule(static) if (slots * d > 65536)
  for (int64_t j = 0; j < slots; ++j) {
    if (rows[j] < 0) continue;
    const float* src = xp + (j / k) * d;
    std::copy(src, src + d, xs + static_cast<int64_t>(rows[j]) * d);
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the rows (data) here.
void moe_permute_backward(const Tensor& d_x_sorted, const Tensor& row_of_slot, const Tensor& d_x) {
  const int64_t t = d_x.dim(0), d = d_x.dim(1), k = row_of_slot.dim(1);
  check_slot_rows(row_of_slot, d_x_sorted.dim(0), false, "moe_permute_backward");
  const int32_t* rows = row_of_slot.data<int32_t>();
  const float* src = d_x_sorted.data<float>();
  float* dst = d_x.data<float>();
  // Per token: the first owned slot's row, plus the later ones in slot order, then one add into
  // d_x (so d_x gets one finished sum per element).
#pragma omp parallel if (t * k * d > 65536)
  {
    std::vector<float> acc(d);
#pragma omp for schedule(static)
    for (int64_t tok = 0; tok < t; ++tok) {
      const int32_t* row = rows + tok * k;
      int64_t i = 0;
      while (i < k && row[i] < 0) ++i;
      if (i == k) continue;
      const float* g0 = src + static_cast<int64_t>(row[i]) * d;
      std::copy(g0, g0 + d, acc.data());
      for (++i; i < k; ++i) {
        if (row[i] < 0) continue;
        const float* g = src + static_cast<int64_t>(row[i]) * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) acc[c] += g[c];
      }
      float* o = dst + tok * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] += acc[c];
    }
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the offsets (data) here.
void moe_grouped_swiglu(const Tensor& x, const Tensor& offsets, const Tensor& w_gate,
                        const Tensor& w_up, const Tensor& w_down, const Tensor& y,
                        const Tensor& gate_up) {
  const int64_t r = x.dim(0), d = x.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  const int64_t max_rows = checked_max_rows(offsets, ne, r, "moe_grouped_swiglu");
  const int32_t* off = offsets.data<int32_t>();

  // Per expert: h = silu(xe @ Wg^T) * (xe @ Wu^T); ye = h @ Wd^T. Experts run one after another,
  // each GEMM threaded by OpenBLAS: calling (pthreads) OpenBLAS from inside an OpenMP region
  // would oversubscribe the cores. f32, bf16 or fp8 weights (sgemm_weight: widened to f32,
  // accumulated in f32). With gate_up, the gate and up GEMMs write there (the same GEMMs, so the
  // same bits) and h goes to scratch instead of over the gate.
  const bool keep = gate_up.defined();
  std::vector<float> g(static_cast<size_t>(max_rows * inter)), u(keep ? 0 : g.size());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  float* gp = keep ? gate_up.data<float>() : nullptr;
  float* up = keep ? gp + r * inter : nullptr;
  const DType wt = w_gate.dtype();
  const size_t es = dtype_size(wt);
  const char* wg = static_cast<const char*>(w_gate.raw());
  const char* wu = static_cast<const char*>(w_up.raw());
  const char* wd = static_cast<const char*>(w_down.raw());
  // FP8 experts: each expert's scale grid follows the previous one's (core/fp8_matrix.h).
  const bool fp8 = wt == DType::kF8E4M3;
  const float* sg = fp8 ? fp8_matrix_scales(w_gate).data<float>() : nullptr;
  const float* su = fp8 ? fp8_matrix_scales(w_up).data<float>() : nullptr;
  const float* sd = fp8 ? fp8_matrix_scales(w_down).data<float>() : nullptr;
  const int64_t up_grid = fp8 ? fp8_scale_shape({inter, d}).numel() : 0;
  const int64_t down_grid = fp8 ? fp8_scale_shape({d, inter}).numel() : 0;
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* xe = xp + off[e] * d;
    const size_t expert_bytes = static_cast<size_t>(inter * d) * es;
    float* ge = keep ? gp + off[e] * inter : g.data();
    float* ue = keep ? up + off[e] * inter : u.data();
    sgemm_weight(n, inter, d, xe, d, wg + e * expert_bytes, wt, d, 0.0f, ge, inter,
                 fp8 ? sg + e * up_grid : nullptr);
    sgemm_weight(n, inter, d, xe, d, wu + e * expert_bytes, wt, d, 0.0f, ue, inter,
                 fp8 ? su + e * up_grid : nullptr);
    silu_mul(ge, ue, g.data(), n * inter);
    sgemm_weight(n, d, inter, g.data(), inter, wd + e * expert_bytes, wt, inter, 0.0f,
                 yp + off[e] * d, d, fp8 ? sd + e * down_grid : nullptr);
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the offsets (data) here.
void moe_grouped_swiglu_backward(const Tensor& x, const Tensor& offsets, const Tensor& w_gate,
                                 const Tensor& w_up, const Tensor& w_down, const Tensor& gate_up,
                                 const Tensor& d_y, const Tensor& d_x, const Tensor& d_w_gate,
                                 const Tensor& d_w_up, const Tensor& d_w_down) {
  const int64_t r = x.dim(0), d = x.dim(1);
  const int64_t ne = w_gate.dim(0), inter = w_gate.dim(1);
  const int64_t max_rows = checked_max_rows(offsets, ne, r, "moe_grouped_swiglu_backward");
  const int32_t* off = offsets.data<int32_t>();
  const bool kept = gate_up.defined();
  const size_t block = static_cast<size_t>(max_rows * inter);
  // g, u: recomputed pre-activations (unless kept); h = silu(g) * u; dg, du their gradients (dg
  // first holds d_h).
  std::vector<float> g(kept ? 0 : block), u(kept ? 0 : block), h(block), dg(block), du(block);
  const float* xp = x.data<float>();
  const float* dyp = d_y.data<float>();
  float* dxp = d_x.data<float>();
  const float* gp = kept ? gate_up.data<float>() : nullptr;
  const float* upp = kept ? gp + r * inter : nullptr;
  const int64_t expert = inter * d;  // elements of one expert's matrix (each of the three)
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* xe = xp + off[e] * d;
    const float* dye = dyp + off[e] * d;
    float* dxe = dxp + off[e] * d;
    const float* wg = w_gate.data<float>() + e * expert;
    const float* wu = w_up.data<float>() + e * expert;
    const float* wd = w_down.data<float>() + e * expert;
    float* dwg = d_w_gate.data<float>() + e * expert;
    float* dwu = d_w_up.data<float>() + e * expert;
    float* dwd = d_w_down.data<float>() + e * expert;
    const float* ge = gp ? gp + off[e] * inter : g.data();
    const float* ue = upp ? upp + off[e] * inter : u.data();
    if (!kept) {  // the forward's GEMMs: the same bits
      sgemm(false, true, n, inter, d, 1.0f, xe, d, wg, d, 0.0f, g.data(), inter);
      sgemm(false, true, n, inter, d, 1.0f, xe, d, wu, d, 0.0f, u.data(), inter);
    }
    silu_mul(ge, ue, h.data(), n * inter);
    // d_h = d_ye @ Wd ([n, D] x [D, I]); d_Wd += d_ye^T @ h.
    sgemm(false, false, n, inter, d, 1.0f, dye, d, wd, inter, 0.0f, dg.data(), inter);
    sgemm(true, false, d, inter, n, 1.0f, dye, d, h.data(), inter, 1.0f, dwd, inter);
    silu_mul_grad(ge, ue, dg.data(), dg.data(), du.data(), n * inter);
    // d_xe = dg @ Wg + du @ Wu; d_Wg += dg^T @ xe; d_Wu += du^T @ xe.
    sgemm(false, false, n, d, inter, 1.0f, dg.data(), inter, wg, d, 0.0f, dxe, d);
    sgemm(false, false, n, d, inter, 1.0f, du.data(), inter, wu, d, 1.0f, dxe, d);
    sgemm(true, false, inter, d, n, 1.0f, dg.data(), inter, xe, d, 1.0f, dwg, d);
    sgemm(true, false, inter, d, n, 1.0f, du.data(), inter, xe, d, 1.0f, dwu, d);
  }
}

void moe_unpermute_combine(const Tensor& y, const Tensor& row_of_slot, const Tensor& weights,
                           const Tensor& out) {
  LOOM_CHECK_F32(y);
  LOOM_CHECK_F32(weights);
  LOOM_CHECK_F32(out);
  check_index_tensor(row_of_slot, "moe_unpermute_combine", "row_of_slot");
  LOOM_CHECK(y.ndim() == 2 && row_of_slot.ndim() == 2 && out.ndim() == 2,
             "moe_unpermute_combine: y %s row_of_slot %s out %s", y.describe().c_str(),
             row_of_slot.describe().c_str(), out.describe().c_str());
  const int64_t t = out.dim(0), d = out.dim(1), k = row_of_slot.dim(1), r = y.dim(0);
  LOOM_CHECK_SHAPE(row_of_slot, t, k);
  LOOM_CHECK_SHAPE(weights, t, k);
  LOOM_CHECK(y.dim(1) == d, "moe_unpermute_combine: y %s out %s", y.describe().c_str(),
             out.describe().c_str());
  const int32_t* rows = row_of_slot.data<int32_t>();
  for (int64_t j = 0; j < t * k; ++j) {
    LOOM_CHECK(rows[j] >= -1 && rows[j] < r, "moe_unpermute_combine: row_of_slot[%d] = %d of %d", j,
               rows[j], r);
  }
  const float* wts = weights.data<float>();
  const float* yp = y.data<float>();
  float* op = out.data<float>();

  // out = w0 * y0, then += w * y for the later choices, in top-k order: a token's sum is the same
  // whatever else is in the batch, and the first term is stored rather than added to zero.
#pragma omp parallel for schedule(static) if (t * d > 32768)
  for (int64_t tok = 0; tok < t; ++tok) {
    float* o = op + tok * d;
    const int32_t* row = rows + tok * k;
    const float* w = wts + tok * k;
    int64_t i = 0;
    while (i < k && row[i] < 0) ++i;
    if (i == k) {
      std::fill(o, o + d, 0.0f);
      continue;
    }
    const float* y0 = yp + static_cast<int64_t>(row[i]) * d;
    const float w0 = w[i];
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] = w0 * y0[c];
    for (++i; i < k; ++i) {
      if (row[i] < 0) continue;
      const float* yi = yp + static_cast<int64_t>(row[i]) * d;
      const float wi = w[i];
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] += wi * yi[c];
    }
  }
}

// Shapes and dtypes are checked in kernels/moe.cc; the rows (data) here.
void moe_unpermute_combine_backward(const Tensor& y, const Tensor& row_of_slot,
                                    const Tensor& weights, const Tensor& d_out, const Tensor& d_y,
                                    const Tensor& d_weights) {
  const int64_t t = d_out.dim(0), d = d_out.dim(1), k = row_of_slot.dim(1);
  check_slot_rows(row_of_slot, y.dim(0), true, "moe_unpermute_combine_backward");
  const int32_t* rows = row_of_slot.data<int32_t>();
  const float* wts = weights.data<float>();
  const float* yp = y.data<float>();
  const float* gp = d_out.data<float>();
  float* dyp = d_y.data<float>();
  float* dwp = d_weights.data<float>();
#pragma omp parallel for schedule(static) if (t * k * d > 32768)
  for (int64_t tok = 0; tok < t; ++tok) {
    const float* g = gp + tok * d;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = tok * k + i;
      if (rows[j] < 0) {
        dwp[j] = 0.0f;
        continue;
      }
      const float* yr = yp + static_cast<int64_t>(rows[j]) * d;
      float* dy = dyp + static_cast<int64_t>(rows[j]) * d;
      const float w = wts[j];
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        dot += double{g[c]} * yr[c];
        dy[c] = w * g[c];
      }
      dwp[j] = static_cast<float>(dot);
    }
  }
}

}  // namespace loom::cpu
