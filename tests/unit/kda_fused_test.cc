// The fused ops of kernels/kda.h on the host, where they are the separate ops composed:
// kda_decode_prepare against each real row run alone through causal_conv1d_forward and the
// separate norm, gate and sigmoid (bit for bit), with padding rows (slot -1) zero and their
// states untouched; rmsnorm_gated_forward against rmsnorm_forward then mul_sigmoid_inplace, in
// place and not; kda_decode_step (kernels/kda_decode_step.h) against the separate ops it stands
// for, bit for bit, and against each row's recurrence run alone (kda_recurrent_forward on a copy
// of its state, then the norm). tests/gpu/kda_fused_cuda_test.cc checks the CUDA kernels against
// both.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/conv.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/kda_decode_step.h"
#include "kernels/norm.h"

namespace loom {
namespace {

Tensor randn(Shape s, std::mt19937& rng, float sd = 1.0f) {
  Tensor t = Tensor::empty(s);
  std::normal_distribution<float> nd(0.0f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
  return t;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.clone(), cb = b.clone();
  return a.shape() == b.shape() && std::memcmp(ca.raw(), cb.raw(), ca.nbytes()) == 0;
}

bool all_zero(const Tensor& t) {
  const Tensor c = t.clone();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (c.data<float>()[i] != 0.0f || std::signbit(c.data<float>()[i])) return false;
  return true;
}

TEST(KdaDecodePrepare, HostIsTheSeparateOpsPerRow) {
  std::mt19937 rng(7);
  const int64_t Hk = 2, Hv = 4, dk = 6, dv = 5, W = 4, num_slots = 9;
  const int64_t ck = Hk * dk, cv = Hv * dv, C = 2 * ck + cv;
  const float eps = 1e-6f;
  for (bool scalar_gate : {false, true}) {
    const std::vector<int32_t> slot_list = {3, -1, 0, 7, -1, 5};
    const int64_t B = static_cast<int64_t>(slot_list.size());
    const int64_t width = scalar_gate ? Hv : Hv * dk;
    const Tensor qkv = randn({B, C}, rng), w = randn({C, W}, rng, 0.5f);
    const Tensor states0 = randn({num_slots, W - 1, C}, rng);
    const Tensor f = randn({B, width}, rng), a_log = randn({Hv}, rng, 0.5f);
    const Tensor dt_bias = randn({width}, rng), beta0 = randn({B, Hv}, rng);
    Tensor slots = Tensor::empty({B}, DType::kI32);
    for (int64_t b = 0; b < B; ++b) slots.data<int32_t>()[b] = slot_list[b];
    for (float lower_bound : {0.0f, -5.0f}) {
      const Tensor states = states0.clone(), beta = beta0.clone();
      Tensor q = Tensor::empty({B, Hk, dk}), k = Tensor::empty({B, Hk, dk});
      Tensor v = Tensor::empty({B, Hv, dv}), g = Tensor::empty({B, width});
      kda_decode_prepare(host_exec(), qkv, w, states, slots, f, a_log, dt_bias, lower_bound, eps,
                         beta, q, k, v, g);

      // Gates and betas: the separate ops over the whole batch, padding rows included.
      Tensor g_ref = Tensor::empty({B, width});
      kda_gate_forward(host_exec(), f, a_log, dt_bias, lower_bound, g_ref);
      const Tensor beta_ref = beta0.clone();
      sigmoid_inplace(host_exec(), beta_ref);
      EXPECT_TRUE(bit_equal(g, g_ref));
      EXPECT_TRUE(bit_equal(beta, beta_ref));

      const Tensor states_ref = states0.clone();
      for (int64_t b = 0; b < B; ++b) {
        const int32_t s = slot_list[b];
        if (s < 0) {
          EXPECT_TRUE(all_zero(q.select(b)) && all_zero(k.select(b)) && all_zero(v.select(b)))
              << "padding row " << b;
          continue;
        }
        Tensor conv = Tensor::empty({1, C});
        causal_conv1d_forward(host_exec(), qkv.slice(0, b, b + 1).clone(), w, states_ref.select(s),
                              /*apply_silu=*/true, conv);
        Tensor qr = Tensor::empty({1, Hk, dk}), kr = Tensor::empty({1, Hk, dk});
        Tensor vr = Tensor::empty({1, cv});
        copy_columns(host_exec(), conv, 0, qr.reshape({1, ck}));
        copy_columns(host_exec(), conv, ck, kr.reshape({1, ck}));
        copy_columns(host_exec(), conv, 2 * ck, vr);
        l2norm_forward(host_exec(), qr, eps, 1.0f, qr);
        l2norm_forward(host_exec(), kr, eps, 1.0f, kr);
        EXPECT_TRUE(bit_equal(q.slice(0, b, b + 1), qr)) << "row " << b;
        EXPECT_TRUE(bit_equal(k.slice(0, b, b + 1), kr)) << "row " << b;
        EXPECT_TRUE(bit_equal(v.slice(0, b, b + 1).reshape({1, cv}), vr)) << "row " << b;
      }
      // Named slots moved along as each row alone moved them; the others (padding's) untouched.
      EXPECT_TRUE(bit_equal(states, states_ref));
    }
  }
}

TEST(KdaDecodePrepare, HostAllPaddingTouchesNothing) {
  std::mt19937 rng(8);
  const int64_t B = 3, Hk = 1, Hv = 2, dk = 4, dv = 3, W = 3, C = 2 * Hk * dk + Hv * dv;
  const Tensor qkv = randn({B, C}, rng), w = randn({C, W}, rng),
               states0 = randn({2, W - 1, C}, rng);
  const Tensor states = states0.clone();
  Tensor slots = Tensor::empty({B}, DType::kI32);
  for (int64_t b = 0; b < B; ++b) slots.data<int32_t>()[b] = -1;
  const Tensor f = randn({B, Hv * dk}, rng), a_log = randn({Hv}, rng), beta = randn({B, Hv}, rng);
  Tensor q = Tensor::full({B, Hk, dk}, NAN), k = Tensor::full({B, Hk, dk}, NAN);
  Tensor v = Tensor::full({B, Hv, dv}, NAN), g = Tensor::empty({B, Hv, dk});
  kda_decode_prepare(host_exec(), qkv, w, states, slots, f, a_log, Tensor(), 0.0f, 1e-6f, beta, q,
                     k, v, g);
  EXPECT_TRUE(all_zero(q) && all_zero(k) && all_zero(v));
  EXPECT_TRUE(bit_equal(states, states0));
}

TEST(RmsNormGated, HostIsNormThenSigmoidGate) {
  std::mt19937 rng(9);
  for (int64_t d : {1, 40, 128, 333}) {
    const int64_t rows = 7;
    const Tensor x = randn({rows, d}, rng, 2.0f), w = randn({d}, rng),
                 gate = randn({rows * d}, rng);
    Tensor ref = Tensor::empty({rows, d});
    rmsnorm_forward(host_exec(), x, w, 1e-5f, 0.0f, ref);
    mul_sigmoid_inplace(host_exec(), ref, gate);
    Tensor out = Tensor::empty({rows, d});
    rmsnorm_gated_forward(host_exec(), x, w, 1e-5f, gate, out);
    EXPECT_TRUE(bit_equal(out, ref)) << "d " << d;
    const Tensor y = x.clone();  // in place
    rmsnorm_gated_forward(host_exec(), y, w, 1e-5f, gate, y);
    EXPECT_TRUE(bit_equal(y, ref)) << "in place, d " << d;
  }
}

// kda_decode_step on the host for KDA (a decay per channel, sigmoid output gate) and GDN (a decay
// per head, two value heads a key head, silu gate).
TEST(KdaDecodeStep, HostIsTheSeparateOps) {
  std::mt19937 rng(10);
  const int64_t dk = 6, dv = 5, W = 4, num_slots = 9;
  const std::vector<int32_t> slot_list = {3, 0, 7, 5};
  const int64_t B = static_cast<int64_t>(slot_list.size());
  for (bool gdn : {false, true}) {
    const int64_t Hk = 2, Hv = gdn ? 4 : 2;
    const int64_t ck = Hk * dk, cv = Hv * dv, C = 2 * ck + cv, width = gdn ? Hv : Hv * dk;
    KdaDecodeStep s;
    s.qkv = randn({B, C}, rng);
    s.conv_weight = randn({C, W}, rng, 0.5f);
    const Tensor conv0 = randn({num_slots, W - 1, C}, rng);
    s.f = randn({B, width}, rng);
    s.A_log = randn({Hv}, rng, 0.5f);
    s.dt_bias = randn({width}, rng);
    const Tensor beta0 = randn({B, Hv}, rng);
    const Tensor states0 = randn({num_slots, Hv, dk, dv}, rng, 0.5f);
    s.state_slots = Tensor::empty({B}, DType::kI32);
    for (int64_t b = 0; b < B; ++b) s.state_slots.data<int32_t>()[b] = slot_list[b];
    s.cu_seqlens = Tensor::empty({B + 1}, DType::kI64);
    for (int64_t b = 0; b <= B; ++b) s.cu_seqlens.data<int64_t>()[b] = b;
    s.lower_bound = gdn ? 0.0f : -5.0f;
    s.scale = 1.0f / std::sqrt(static_cast<float>(dk));
    s.norm_weight = randn({dv}, rng);
    s.norm_eps = 1e-5f;
    s.gate = randn({B, cv}, rng);
    s.gate_silu = gdn;

    s.conv_states = conv0.clone();
    s.states = states0.clone();
    s.beta = beta0.clone();
    Tensor out = Tensor::full({B, Hv, dv}, NAN);
    kda_decode_step(host_exec(), s, out);
    EXPECT_FALSE(kda_decode_step_is_fused(host_exec(), s, out));

    // The separate ops.
    const Tensor conv = conv0.clone(), states = states0.clone(), beta = beta0.clone();
    Tensor q = Tensor::empty({B, Hk, dk}), k = Tensor::empty({B, Hk, dk});
    Tensor v = Tensor::empty({B, Hv, dv}), g = Tensor::empty({B, Hv, width / Hv});
    kda_decode_prepare(host_exec(), s.qkv, s.conv_weight, conv, s.state_slots, s.f, s.A_log,
                       s.dt_bias, s.lower_bound, s.qk_eps, beta, q, k, v, g);
    const Tensor q0 = q.clone(), k0 = k.clone(), v0 = v.clone(), g0 = g.clone(),
                 sig_beta = beta.clone();
    Tensor ref = Tensor::empty({B, Hv, dv});
    kda_varlen_forward(host_exec(), q, k, v, g, beta, s.scale, states, s.state_slots, s.cu_seqlens,
                       ref, 1);
    const Tensor rows = ref.reshape({B * Hv, dv});
    if (gdn) {
      rmsnorm_forward(host_exec(), rows, s.norm_weight, s.norm_eps, 0.0f, rows);
      mul_silu_inplace(host_exec(), rows, s.gate);
    } else {
      rmsnorm_gated_forward(host_exec(), rows, s.norm_weight, s.norm_eps, s.gate, rows);
    }
    EXPECT_TRUE(bit_equal(out, ref)) << "gdn " << gdn;
    EXPECT_TRUE(bit_equal(s.conv_states, conv)) << "gdn " << gdn;
    EXPECT_TRUE(bit_equal(s.states, states)) << "gdn " << gdn;

    // Each row alone: its recurrence on a copy of its state, the norm and the gate by hand.
    for (int64_t b = 0; b < B; ++b) {
      const int32_t slot = slot_list[static_cast<size_t>(b)];
      const Tensor st = states0.select(slot).clone();
      Tensor o = Tensor::empty({1, Hv, dv});
      kda_recurrent_forward(host_exec(), q0.slice(0, b, b + 1).clone(),
                            k0.slice(0, b, b + 1).clone(), v0.slice(0, b, b + 1).clone(),
                            g0.slice(0, b, b + 1).clone(), sig_beta.slice(0, b, b + 1).clone(),
                            s.scale, st, o);
      double max_state = 0.0, max_out = 0.0;
      for (int64_t i = 0; i < st.numel(); ++i)
        max_state = std::max(max_state, std::fabs(static_cast<double>(st.data<float>()[i]) -
                                                  s.states.select(slot).clone().data<float>()[i]));
      for (int64_t h = 0; h < Hv; ++h) {
        double ss = 0.0;
        for (int64_t j = 0; j < dv; ++j) ss += std::pow(o.data<float>()[h * dv + j], 2);
        const double inv = 1.0 / std::sqrt(ss / dv + s.norm_eps);
        for (int64_t j = 0; j < dv; ++j) {
          const double z = s.gate.data<float>()[(b * Hv + h) * dv + j];
          const double act = gdn ? z / (1.0 + std::exp(-z)) : 1.0 / (1.0 + std::exp(-z));
          const double want =
              o.data<float>()[h * dv + j] * inv * s.norm_weight.data<float>()[j] * act;
          max_out = std::max(max_out, std::fabs(want - out.data<float>()[(b * Hv + h) * dv + j]));
        }
      }
      EXPECT_LT(max_state, 1e-5) << "gdn " << gdn << " row " << b;
      EXPECT_LT(max_out, 1e-4) << "gdn " << gdn << " row " << b;
    }
  }
}

}  // namespace
}  // namespace loom
