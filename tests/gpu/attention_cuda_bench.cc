// Varlen attention benchmarks with CUDA events (median of many timed calls after warm-up), each
// next to its roofline: the device-to-device copy measured in the same run for the decode rows
// (cache bytes read / time against copy bytes moved / time), and the datasheet's dense bf16
// tensor-core (989 TFLOP/s) or plain f32 (67 TFLOP/s) rate for the prefill rows.
//
//  - MLA absorbed decode, the target: 32 heads, latent 512 + rope 64, bf16 cache, one new
//    row per sequence over contexts of 4K..128K keys, batch 1..64. "core" rows time the attention
//    over the latent cache alone (mla_latent_attention_varlen: schedule, attention, combine);
//    "op" rows the whole mla_attention_varlen (plus the two projections, which read kv_b, 16.8 MB
//    of f32, every call). Bytes: the cache rows read, (512 + 64) * 2 per key and sequence.
//    Paths: the default (by shape: TMA + wgmma on the H200 with pages of 64, splits sized by
//    the batch's occupancy), "_graph" the same replayed as a CUDA graph (as the engine's decode
//    steps run), "_mma" the mma.sync kernel (attention_mla_tc.cu); variants: "_perlen" splits
//    sized by each sequence's length alone (1024 keys at least, the earlier default),
//    "_chunk2048" the same with 2048. "fixed_cost" rows: a call over one or two key tiles, and
//    the floor of any launch (a 4-byte memset), to show what bounds the small cells.
//  - GQA decode (32 query heads over 8 KV heads of 128, f32 and bf16 caches) and prefill.
// Caches are filled from a random block (never zeros); page ids are shuffled.
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines.
// LOOM_BENCH_ONLY=mla runs the copy and the MLA rows alone; =mla_ncu a few batch-1 calls for ncu;
// =mla_fp8 the copy and MLA decode over fp8 pages against bf16 ones (bench_mla_fp8).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/workspace.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/graph.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr double kBf16TFlops = 989.0;  // H100/H200 SXM dense bf16 tensor cores, datasheet
constexpr double kF32TFlops = 67.0;    // plain f32, datasheet

std::mt19937& rng() {
  static std::mt19937 r(12345);
  return r;
}

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}
cudaStream_t stream() { return cuda::stream_of(gpu()); }

// A device tensor filled from a 64 MB random block (repeated).
Tensor filled(Shape shape, DType dtype, float scale = 1.0f) {
  Tensor d = Tensor::empty(shape, dtype, Device::kCuda);
  const size_t block = std::min<size_t>(d.nbytes(), size_t{64} << 20);
  if (block == 0) return d;
  std::vector<uint8_t> h(block);
  std::normal_distribution<float> nd(0.0f, scale);
  if (dtype == DType::kBF16) {
    uint16_t* p = reinterpret_cast<uint16_t*>(h.data());
    for (size_t i = 0; i < block / 2; ++i) p[i] = f32_to_bf16(nd(rng()));
  } else {
    float* p = reinterpret_cast<float*>(h.data());
    for (size_t i = 0; i < block / 4; ++i) p[i] = nd(rng());
  }
  char* dst = static_cast<char*>(d.raw());
  LOOM_CUDA_CHECK(cudaMemcpy(dst, h.data(), block, cudaMemcpyHostToDevice));
  for (size_t off = block; off < d.nbytes(); off += block)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst + off, dst, std::min(block, d.nbytes() - off),
                                    cudaMemcpyDeviceToDevice, stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return d;
}

Tensor i64_dev(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return cuda::to_device(t);
}

// B sequences of `rows` new rows each after `past` cached keys, pages of `page_size` drawn
// shuffled from [0, num_pages).
struct Step {
  int64_t B = 0, N = 0;
  Tensor table, cu, past;
};
Step make_step(int64_t B, int64_t rows, int64_t past, int64_t page_size, int64_t num_pages,
               bool shuffled = true) {
  Step s;
  s.B = B;
  s.N = B * rows;
  const int64_t per = (past + rows + page_size - 1) / page_size;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  if (shuffled) std::shuffle(ids.begin(), ids.end(), rng());
  Tensor t = Tensor::empty({B, per}, DType::kI32);
  std::copy(ids.begin(), ids.begin() + B * per, t.data<int32_t>());
  s.table = cuda::to_device(t);
  std::vector<int64_t> cu(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[b] = b * rows;
  s.cu = i64_dev(cu);
  s.past = i64_dev(std::vector<int64_t>(static_cast<size_t>(B), past));
  return s;
}

double median_ms(const std::function<void()>& fn, int iters) {
  return median_event_ms(
      stream(), [&](int) { fn(); }, iters, 3);
}

// The median time of replaying what `fn` enqueues, recorded once as a CUDA graph (after one
// eager call, so that first-call setup stays out of the recording).
double graph_ms(const std::function<void()>& fn, int iters) {
  fn();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const absl::StatusOr<cuda::CapturedGraph> g = cuda::capture(stream(), [&] { fn(); });
  if (!g.ok()) {
    std::fprintf(stderr, "graph capture failed: %s\n", g.status().ToString().c_str());
    std::exit(1);
  }
  const double ms = median_ms([&] { cuda::replay(g->exec, stream()); }, iters);
  cuda::destroy(g->exec);
  return ms;
}

double g_copy_gbs = 0.0;

void bench_copy() {
  const int64_t n = int64_t{1} << 28;  // 1 GiB of f32
  Tensor a = filled({n}, DType::kF32), b = Tensor::empty({n}, DType::kF32, Device::kCuda);
  const double ms = median_ms(
      [&] {
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(b.raw(), a.raw(), a.nbytes(), cudaMemcpyDeviceToDevice, stream()));
      },
      20);
  g_copy_gbs = 2.0 * a.nbytes() / (ms * 1e6);
  emit_gpubench("d2d_copy_1GiB_read+write", g_copy_gbs, "GB/s", 4800.0, ms);
}

std::string ctx_name(int64_t keys) {
  return keys % 1024 == 0 ? std::to_string(keys / 1024) + "K" : std::to_string(keys);
}

void bench_mla_decode(Workspace& ws) {
  const MlaDims m{32, 128, 64, 128, 512};
  const int64_t ps = 64, max_keys = int64_t{64} * 131072 + 64 * 64;
  const int64_t num_pages = max_keys / ps;
  const Tensor latent = filled({num_pages, ps, m.latent_dim}, DType::kBF16);
  const Tensor rope = filled({num_pages, ps, m.rope_dim}, DType::kBF16);
  const Tensor kv_b = filled({m.heads * (m.nope_dim + m.v_dim), m.latent_dim}, DType::kF32,
                             1.0f / std::sqrt(512.0f));
  const float scale = 1.0f / std::sqrt(192.0f);
  Exec ex = gpu();
  ex.workspace = &ws;
  struct Variant {
    std::string name;
    cuda::AttentionTuning t;
  };
  const std::vector<Variant> variants = {
      {"mma", {.mla_path = 2}},
      {"perlen", {.split = 1}},
      {"chunk2048", {.min_chunk = 2048}},
      {"sync", {.sync_handoff = true}},
  };
  // Batch 1 only: smaller per-length splits (more units than SMs at 128K).
  const std::vector<Variant> b1_variants = {
      {"chunk256", {.min_chunk = 256}},
      {"chunk512", {.min_chunk = 512}},
      {"chunk512_max256", {.min_chunk = 512, .max_splits = 256}},
      {"probe_setup", {.probe = 3}},
      {"probe_no_tiles", {.probe = 4}},
      {"probe_schedule", {.probe = 5}},
      {"probe_no_combine", {.probe = 6}},
  };
  // The fixed cost of a call: one key tile of one row (schedule + attention), and two tiles split
  // in two (+ the combine); eager, and replayed as a CUDA graph (how the engine runs decode).
  for (const auto& [ctx, t] :
       {std::pair<int64_t, cuda::AttentionTuning>{64, {}}, {128, {.min_chunk = 64}}}) {
    const Step s = make_step(1, 1, ctx - 1, ps, num_pages);
    const Tensor q_lat = filled({1, m.heads, m.latent_dim + m.rope_dim}, DType::kF32, 0.05f);
    const Tensor o_lat = Tensor::empty({1, m.heads, m.latent_dim}, DType::kF32, Device::kCuda);
    const cuda::AttentionTuning tune = t;
    auto call = [&] {
      ws.reset();
      cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, s.table, s.cu, s.past, scale,
                                        o_lat, tune);
    };
    const std::string name = "mla_decode_core_fixed_cost_B1_ctx" + std::to_string(ctx) +
                             (ctx == 128 ? "_2splits" : "_nosplit");
    const double bytes = static_cast<double>(ctx) * (m.latent_dim + m.rope_dim) * 2;
    double ms = median_ms(call, 200);
    emit_gpubench(name.c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
    ms = graph_ms(call, 200);
    emit_gpubench((name + "_graph").c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
    for (int probe : {3, 4, 5, 6}) {  // where the fixed cost goes (AttnArgs::probe)
      cuda::AttentionTuning pt = tune;
      pt.probe = probe;
      ms = graph_ms(
          [&] {
            ws.reset();
            cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, s.table, s.cu, s.past, scale,
                                              o_lat, pt);
          },
          200);
      emit_gpubench((name + "_graph_probe" + std::to_string(probe)).c_str(), bytes / (ms * 1e6),
                    "GB/s", g_copy_gbs, ms);
    }
  }
  {  // the floor of any call: one 4-byte memset, eager and in a graph
    Tensor t = Tensor::empty({1}, DType::kF32, Device::kCuda);
    auto call = [&] { LOOM_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, 4, stream())); };
    double ms = median_ms(call, 200);
    emit_gpubench("launch_floor_memset4", 0.0, "GB/s", g_copy_gbs, ms);
    ms = graph_ms(call, 200);
    emit_gpubench("launch_floor_memset4_graph", 0.0, "GB/s", g_copy_gbs, ms);
  }
  for (int64_t B : {1, 8, 64}) {
    for (int64_t ctx : {4096, 32768, 131072}) {
      const Step s = make_step(B, 1, ctx - 1, ps, num_pages);
      const Tensor q = filled({s.N, m.heads, m.nope_dim + m.rope_dim}, DType::kF32);
      const Tensor q_lat = filled({s.N, m.heads, m.latent_dim + m.rope_dim}, DType::kF32, 0.05f);
      const Tensor out = Tensor::empty({s.N, m.heads, m.v_dim}, DType::kF32, Device::kCuda);
      const Tensor o_lat = Tensor::empty({s.N, m.heads, m.latent_dim}, DType::kF32, Device::kCuda);
      const double bytes = static_cast<double>(B) * ctx * (m.latent_dim + m.rope_dim) * 2;
      const int iters = bytes > 1e9 ? 20 : 50;
      char shape_buf[64];
      std::snprintf(shape_buf, sizeof(shape_buf), "B%lld_ctx%s", static_cast<long long>(B),
                    ctx_name(ctx).c_str());
      const std::string shape = shape_buf;
      auto core = [&](const cuda::AttentionTuning& t) {
        return median_ms(
            [&] {
              ws.reset();
              cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, s.table, s.cu, s.past,
                                                scale, o_lat, t);
            },
            iters);
      };
      double ms = median_ms(
          [&] {
            ws.reset();
            mla_attention_varlen(ex, q, latent, rope, s.table, s.cu, s.past, kv_b, m, scale, out);
          },
          iters);
      emit_gpubench(("mla_decode_op_" + shape).c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
      ms = core({});
      emit_gpubench(("mla_decode_core_" + shape).c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs,
                    ms);
      ms = graph_ms(
          [&] {
            ws.reset();
            cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, s.table, s.cu, s.past, scale,
                                              o_lat);
          },
          iters);
      emit_gpubench(("mla_decode_core_" + shape + "_graph").c_str(), bytes / (ms * 1e6), "GB/s",
                    g_copy_gbs, ms);
      for (const Variant& v : variants) {
        ms = core(v.t);
        emit_gpubench(("mla_decode_core_" + shape + "_" + v.name).c_str(), bytes / (ms * 1e6),
                      "GB/s", g_copy_gbs, ms);
      }
      if (B == 1) {
        for (const Variant& v : b1_variants) {
          ms = core(v.t);
          emit_gpubench(("mla_decode_core_" + shape + "_" + v.name).c_str(), bytes / (ms * 1e6),
                        "GB/s", g_copy_gbs, ms);
        }
      }
      if ((B == 1 && ctx == 131072) || (B == 64 && ctx == 32768)) {
        // Diagnostics, for both tensor-core kernels: the arithmetic alone (probe 1), the loads
        // alone (probe 2); and pages in order instead of shuffled over the whole pool.
        for (int path : {2, 3}) {
          const std::string pn = path == 2 ? "_mma" : "_wgmma";
          cuda::AttentionTuning t;
          t.mla_path = path;
          t.probe = 1;
          ms = core(t);
          emit_gpubench(("mla_decode_core_" + shape + pn + "_probe_math").c_str(),
                        bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
          t.probe = 2;
          ms = core(t);
          emit_gpubench(("mla_decode_core_" + shape + pn + "_probe_loads").c_str(),
                        bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
        }
        const Step in_order = make_step(B, 1, ctx - 1, ps, num_pages, false);
        ms = median_ms(
            [&] {
              ws.reset();
              cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, in_order.table,
                                                in_order.cu, in_order.past, scale, o_lat);
            },
            iters);
        emit_gpubench(("mla_decode_core_" + shape + "_pages_in_order").c_str(), bytes / (ms * 1e6),
                      "GB/s", g_copy_gbs, ms);
      }
      {  // the CUDA-core path on the same bf16 cache, for comparison
        cuda::AttentionTuning t;
        t.mla_path = 1;
        if (B * ctx <= 32 * 32768) {
          ms = core(t);
          emit_gpubench(("mla_decode_core_" + shape + "_simt").c_str(), bytes / (ms * 1e6), "GB/s",
                        g_copy_gbs, ms);
        }
      }
    }
  }
  {  // Prefill in absorbed form on tensor cores: one sequence of 2048 new rows after 2048 keys.
    const int64_t T = 2048, past = 2048;
    const Step s = make_step(1, T, past, ps, num_pages);
    const Tensor q = filled({s.N, m.heads, m.nope_dim + m.rope_dim}, DType::kF32);
    const Tensor out = Tensor::empty({s.N, m.heads, m.v_dim}, DType::kF32, Device::kCuda);
    const double ms = median_ms(
        [&] {
          ws.reset();
          mla_attention_varlen(ex, q, latent, rope, s.table, s.cu, s.past, kv_b, m, scale, out);
        },
        10);
    double flops = 0.0;
    for (int64_t i = 0; i < T; ++i)
      flops += 2.0 * (past + i + 1) * m.heads * (2 * m.latent_dim + m.rope_dim);
    emit_gpubench("mla_prefill_op_T2048_past2048_bf16", flops / (ms * 1e9), "TFLOP/s", kBf16TFlops,
                  ms);
  }
}

// LOOM_BENCH_ONLY=mla_ncu: a few calls of the batch-1 cells and nothing else, for a profiler
// (ncu) to time each kernel of a call apart: one key tile, 4K and 128K keys, default and
// per-length splits.
void profile_mla_batch1(Workspace& ws) {
  const MlaDims m{32, 128, 64, 128, 512};
  const int64_t ps = 64, num_pages = 131072 / ps + 64;
  const Tensor latent = filled({num_pages, ps, m.latent_dim}, DType::kBF16);
  const Tensor rope = filled({num_pages, ps, m.rope_dim}, DType::kBF16);
  const float scale = 1.0f / std::sqrt(192.0f);
  Exec ex = gpu();
  ex.workspace = &ws;
  const Tensor q_lat = filled({1, m.heads, m.latent_dim + m.rope_dim}, DType::kF32, 0.05f);
  const Tensor o_lat = Tensor::empty({1, m.heads, m.latent_dim}, DType::kF32, Device::kCuda);
  for (int64_t ctx : {int64_t{64}, int64_t{4096}, int64_t{131072}}) {
    const Step s = make_step(1, 1, ctx - 1, ps, num_pages);
    for (const cuda::AttentionTuning& t :
         {cuda::AttentionTuning{}, cuda::AttentionTuning{.split = 1}}) {
      for (int i = 0; i < 3; ++i) {
        ws.reset();
        cuda::mla_latent_attention_varlen(ex, q_lat, latent, rope, s.table, s.cu, s.past, scale,
                                          o_lat, t);
      }
      cuda::synchronize();
      std::printf("profiled ctx %lld split %d: 3 calls\n", static_cast<long long>(ctx), t.split);
    }
  }
}

void bench_gqa(Workspace& ws) {
  const int64_t hq = 32, hkv = 8, d = 128, ps = 64;
  Exec ex = gpu();
  ex.workspace = &ws;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const std::string tn = dt == DType::kBF16 ? "bf16" : "f32";
    const int64_t max_keys = int64_t{64} * 32768 + 64 * 64, num_pages = max_keys / ps;
    const Tensor k = filled({num_pages, ps, hkv, d}, dt), v = filled({num_pages, ps, hkv, d}, dt);
    const double es = dt == DType::kBF16 ? 2.0 : 4.0;
    for (int64_t B : {1, 64}) {
      for (int64_t ctx : {4096, 32768}) {
        const Step s = make_step(B, 1, ctx - 1, ps, num_pages);
        const Tensor q = filled({s.N, hq, d}, DType::kF32);
        const Tensor out = Tensor::empty({s.N, hq, d}, DType::kF32, Device::kCuda);
        const double bytes = static_cast<double>(B) * ctx * 2 * hkv * d * es;
        const double ms = median_ms(
            [&] {
              ws.reset();
              gqa_attention_varlen(ex, q, k, v, s.table, s.cu, s.past, scale, out);
            },
            bytes > 1e9 ? 20 : 50);
        const std::string name =
            "gqa_decode_" + tn + "_B" + std::to_string(B) + "_ctx" + ctx_name(ctx);
        emit_gpubench(name.c_str(), bytes / (ms * 1e6), "GB/s", g_copy_gbs, ms);
        if (B == 64 && ctx == 32768) {  // diagnostics, as for MLA
          for (int probe : {1, 2}) {
            cuda::AttentionTuning t;
            t.probe = probe;
            const double pms = median_ms(
                [&] {
                  ws.reset();
                  cuda::gqa_attention_varlen_tuned(ex, q, k, v, s.table, s.cu, s.past, scale, out,
                                                   t);
                },
                20);
            emit_gpubench((name + (probe == 1 ? "_probe_math" : "_probe_loads")).c_str(),
                          bytes / (pms * 1e6), "GB/s", g_copy_gbs, pms);
          }
          const Step in_order = make_step(B, 1, ctx - 1, ps, num_pages, false);
          const double pms = median_ms(
              [&] {
                ws.reset();
                gqa_attention_varlen(ex, q, k, v, in_order.table, in_order.cu, in_order.past, scale,
                                     out);
              },
              20);
          emit_gpubench((name + "_pages_in_order").c_str(), bytes / (pms * 1e6), "GB/s", g_copy_gbs,
                        pms);
        }
      }
    }
    // Prefill: one sequence of 4096 new rows, and 2048 after 2048 cached.
    for (const auto& [T, past] : {std::pair<int64_t, int64_t>{4096, 0}, {2048, 2048}}) {
      const Step s = make_step(1, T, past, ps, num_pages);
      const Tensor q = filled({s.N, hq, d}, DType::kF32);
      const Tensor out = Tensor::empty({s.N, hq, d}, DType::kF32, Device::kCuda);
      const double ms = median_ms(
          [&] {
            ws.reset();
            gqa_attention_varlen(ex, q, k, v, s.table, s.cu, s.past, scale, out);
          },
          5);
      double flops = 0.0;
      for (int64_t i = 0; i < T; ++i) flops += 2.0 * (past + i + 1) * hq * (2 * d);
      emit_gpubench(
          ("gqa_prefill_" + tn + "_T" + std::to_string(T) + "_past" + std::to_string(past)).c_str(),
          flops / (ms * 1e9), "TFLOP/s", kF32TFlops, ms);
    }
  }
}
// A device fp8 pool [pages, ps, n + 4] (kernels/attention.h's vectors): random finite codes (no
// NaN: 0x7F and 0xFF are skipped) and a scale of 2^-6 a vector, from a block of whole vectors.
Tensor filled_fp8(int64_t pages, int64_t ps, int64_t n) {
  const int64_t vec = n + kKvFp8ScaleBytes;
  Tensor d = Tensor::empty({pages, ps, vec}, DType::kF8E4M3, Device::kCuda);
  const size_t block =
      std::min<size_t>(d.nbytes(), ((size_t{64} << 20) / static_cast<size_t>(vec)) * vec);
  std::vector<uint8_t> h(block);
  std::uniform_int_distribution<int> code(0, 253);
  const float sc = 1.0f / 64.0f;
  for (size_t v = 0; v < block / vec; ++v) {
    uint8_t* p = h.data() + v * vec;
    for (int64_t i = 0; i < n; ++i) {
      const int c = code(rng());
      p[i] = static_cast<uint8_t>(c >= 0x7F ? c + 1 : c);
    }
    std::memcpy(p + n, &sc, 4);
  }
  char* dst = static_cast<char*>(d.raw());
  LOOM_CUDA_CHECK(cudaMemcpy(dst, h.data(), block, cudaMemcpyHostToDevice));
  for (size_t off = block; off < d.nbytes(); off += block)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst + off, dst, std::min(block, d.nbytes() - off),
                                    cudaMemcpyDeviceToDevice, stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return d;
}

// LOOM_BENCH_ONLY=mla_fp8: MLA's latent attention (decode, pages of 64) over fp8 pages against
// bf16 ones, batch 1, 8 and 64 at 32K and 128K keys. Bytes: the cache rows each reads, (512 + 64)
// * 2 per key (bf16) and 516 + 68 (fp8, codes and scales). Rows: "_bf16" the default path over
// bf16 pages (wgmma), "_fp8" the default over fp8 pages (wgmma's fp8 variant on the H200),
// "_fp8_mma" the mma.sync kernel over fp8 pages (the earlier route), and at batch 1 and 64 the
// fp8 wgmma kernel's probes (arithmetic alone on stale tiles, loads and widening alone).
void bench_mla_fp8(Workspace& ws) {
  const int64_t ps = 64, max_keys = int64_t{64} * 131072 + 64 * 64;
  const int64_t num_pages = max_keys / ps;
  const Tensor latent = filled({num_pages, ps, 512}, DType::kBF16);
  const Tensor rope = filled({num_pages, ps, 64}, DType::kBF16);
  const Tensor latent8 = filled_fp8(num_pages, ps, 512), rope8 = filled_fp8(num_pages, ps, 64);
  const float scale = 1.0f / std::sqrt(192.0f);
  Exec ex = gpu();
  ex.workspace = &ws;
  for (int64_t B : {1, 8, 64}) {
    for (int64_t ctx : {32768, 131072}) {
      const Step s = make_step(B, 1, ctx - 1, ps, num_pages);
      const Tensor q_lat = filled({s.N, 32, 576}, DType::kF32, 0.05f);
      const Tensor o_lat = Tensor::empty({s.N, 32, 512}, DType::kF32, Device::kCuda);
      const int iters = B * ctx > 1000000 ? 20 : 50;
      const std::string shape = "B" + std::to_string(B) + "_ctx" + ctx_name(ctx);
      auto run = [&](const std::string& tag, const Tensor& lat, const Tensor& rp,
                     const cuda::AttentionTuning& t, double key_bytes) {
        const double ms = median_ms(
            [&] {
              ws.reset();
              cuda::mla_latent_attention_varlen(ex, q_lat, lat, rp, s.table, s.cu, s.past, scale,
                                                o_lat, t);
            },
            iters);
        const double bytes = static_cast<double>(B) * ctx * key_bytes;
        emit_gpubench(("mla_decode_core_" + shape + tag).c_str(), bytes / (ms * 1e6), "GB/s",
                      g_copy_gbs, ms);
      };
      run("_bf16", latent, rope, {}, 1152.0);
      run("_fp8", latent8, rope8, {}, 584.0);
      run("_fp8_mma", latent8, rope8, {.mla_path = 2}, 584.0);
      if (B != 8 && ctx == 131072) {
        run("_fp8_probe_math", latent8, rope8, {.mla_path = 3, .probe = 1}, 584.0);
        run("_fp8_probe_loads", latent8, rope8, {.mla_path = 3, .probe = 2}, 584.0);
      }
    }
  }
}

}  // namespace
}  // namespace loom

int main() {
  using namespace loom;
  cuda::init();
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  Workspace ws(Device::kCuda, size_t{1} << 30);
  const char* only = std::getenv("LOOM_BENCH_ONLY");
  if (only != nullptr && std::string(only) == "mla_ncu") {
    profile_mla_batch1(ws);
    return 0;
  }
  bench_copy();
  if (only != nullptr && std::string(only) == "mla_fp8") {
    bench_mla_fp8(ws);
    cuda::synchronize();
    return 0;
  }
  bench_mla_decode(ws);
  if (only == nullptr || std::string(only) != "mla") bench_gqa(ws);
  cuda::synchronize();
  return 0;
}
