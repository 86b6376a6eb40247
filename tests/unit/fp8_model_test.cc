// Models with FP8 matrices on the CPU: deepseek_v3_fp8 kept as stored (auto) and kimi_linear_b0
// quantized at load (fp8) compute the logits of the same FP8 values dequantized to f32 (bit for bit
// in batch-invariant mode), in about half the bf16 bytes; the stored bytes and scales are the
// checkpoint's; loom-convert keeps them; a GPU placement resolves auto to them (unless f32
// activations ask for the f32 path); a trainable one is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/fp8_matrix.h"
#include "engine/model/model.h"
#include "engine/model/native_export.h"
#include "weights/fp8.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;
const std::string kTmp = LOOM_TEST_TMPDIR;

std::vector<int32_t> prompt(const std::string& fixture, int i) {
  auto golden = SafetensorsFile::open(kFixtures + "/" + fixture + "/golden.safetensors");
  EXPECT_TRUE(golden.ok()) << golden.status();
  const Tensor ids = *(*golden)->get("input_ids_" + std::to_string(i));
  std::vector<int32_t> out;
  for (int64_t t = 0; t < ids.numel(); ++t) out.push_back(int32_t(ids.data<int64_t>()[t]));
  return out;
}

Tensor golden_logits(const std::string& fixture, int i) {
  auto golden = SafetensorsFile::open(kFixtures + "/" + fixture + "/golden.safetensors");
  return (*golden)->get("logits_" + std::to_string(i))->to_f32();
}

// Full-prefill logits [T, V], then 4 decode steps of the argmax (the cache path), appended.
std::vector<float> run(const Model& m, const std::vector<int32_t>& ids, bool invariant) {
  SequenceCache cache = m.new_cache();
  ForwardBatch b;
  b.batch_invariant = invariant;
  b.token_ids = ids;
  b.seqs.push_back(
      {.num_tokens = int64_t(ids.size()), .logits = LogitsMode::kAll, .cache = &cache});
  auto l = m.forward(b);
  EXPECT_TRUE(l.ok()) << l.status();
  std::vector<float> out(l->data<float>(), l->data<float>() + l->numel());
  const int64_t v = m.config().vocab_size;
  for (int s = 0; s < 4; ++s) {
    const float* last = out.data() + out.size() - v;
    ForwardBatch d;
    d.batch_invariant = invariant;
    d.token_ids = {int32_t(std::max_element(last, last + v) - last)};
    d.seqs.push_back({.num_tokens = 1, .logits = LogitsMode::kLast, .cache = &cache});
    auto dl = m.forward(d);
    EXPECT_TRUE(dl.ok()) << dl.status();
    out.insert(out.end(), dl->data<float>(), dl->data<float>() + v);
  }
  return out;
}

double rel_l2(const float* a, const float* ref, int64_t n) {
  double e2 = 0, r2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    e2 += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    r2 += double(ref[i]) * ref[i];
  }
  return std::sqrt(e2 / r2);
}

// A native checkpoint of `m` with every FP8 matrix dequantized to f32: the reference model of the
// same values (written through the native writer, so the loader's own dequantization is not
// what is tested).
std::unique_ptr<Model> dequantized_copy(const Model& m, const std::string& name) {
  WeightLoader::Record record;
  for (const ParameterArena::Entry& e : m.parameters().entries()) {
    if (e.tensor.dtype() == DType::kF8E4M3) {
      auto w = dequantize_fp8_blocks(e.tensor, fp8_matrix_scales(e.tensor), 128, 128, e.name);
      EXPECT_TRUE(w.ok()) << w.status();
      record.emplace_back(e.name, *w);
    } else {
      record.emplace_back(e.name, e.tensor);
    }
  }
  const std::string dir = kTmp + "/" + name;
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(write_native_checkpoint(m.config(), record, dir).ok());
  auto f32 = Model::load(dir, Placement{.dtype = WeightDType::kF32});
  EXPECT_TRUE(f32.ok()) << f32.status();
  return std::move(f32).value();
}

// The logits of `fp8` against the f32 model of its dequantized values: bit for bit in
// batch-invariant mode; otherwise within f32 rounding (the GEMMs sum in another order for 1 and
// 9-32 rows, as the bf16 placement's do: bf16_weights_test measured rel L2 <= 3.2e-6 there).
void expect_dequantized_logits(const Model& fp8, const Model& f32, const std::string& fixture) {
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> ids = prompt(fixture, i);
    const std::vector<float> a = run(fp8, ids, true), b = run(f32, ids, true);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << fixture << " prompt " << i << " batch-invariant";
    const std::vector<float> c = run(fp8, ids, false), d = run(f32, ids, false);
    const double r = rel_l2(c.data(), d.data(), int64_t(c.size()));
    const Tensor gold = golden_logits(fixture, i);
    const double g = rel_l2(c.data(), gold.data<float>(), gold.numel());
    std::printf(
        "%s prompt %d: fp8-stored vs f32-dequantized logits rel L2 %.3g (invariant: 0); "
        "vs the f32 golden %.3g\n",
        fixture.c_str(), i, r, g);
    EXPECT_LE(r, 1e-5);
  }
}

TEST(Fp8Model, DeepSeekFp8KeptAsStored) {
  const std::string dir = kFixtures + "/deepseek_v3_fp8";
  auto m = Model::load(dir, Placement{.dtype = WeightDType::kAuto});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->placement().dtype, WeightDType::kFP8) << "auto keeps an FP8 checkpoint FP8";
  // Every FP8 checkpoint tensor's bytes and scales are in the arena as they are in the file.
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.ok());
  const ParameterArena& arena = (*m)->parameters();
  int checked = 0;
  const std::string names[] = {"layers.0.mla.q_b_proj.weight", "layers.1.mla.kv_a_proj.weight",
                               "layers.0.mlp.down_proj.weight",
                               "layers.2.moe.shared.up_proj.weight"};
  const std::string files[] = {"model.layers.0.self_attn.q_b_proj.weight",
                               "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                               "model.layers.0.mlp.down_proj.weight",
                               "model.layers.2.mlp.shared_experts.up_proj.weight"};
  for (int i = 0; i < 4; ++i) {
    const Tensor* t = arena.find(names[i]);
    ASSERT_NE(t, nullptr) << names[i];
    ASSERT_EQ(t->dtype(), DType::kF8E4M3) << names[i];
    const Tensor q = *ckpt->get(files[i]), s = *ckpt->get(files[i] + "_scale_inv");
    ASSERT_EQ(t->shape(), q.shape());
    EXPECT_EQ(std::memcmp(t->raw(), q.raw(), q.nbytes()), 0) << names[i];
    const Tensor ts = fp8_matrix_scales(*t);
    ASSERT_EQ(ts.shape(), s.shape());
    EXPECT_EQ(std::memcmp(ts.raw(), s.raw(), s.nbytes()), 0) << names[i];
    ++checked;
  }
  // Stacked experts: expert 5's slice of the stack is the checkpoint's expert 5.
  const Tensor* down = arena.find("layers.1.moe.experts.down");
  ASSERT_NE(down, nullptr);
  ASSERT_EQ(down->dtype(), DType::kF8E4M3);
  const Tensor q5 = *ckpt->get("model.layers.1.mlp.experts.5.down_proj.weight");
  const Tensor s5 = *ckpt->get("model.layers.1.mlp.experts.5.down_proj.weight_scale_inv");
  EXPECT_EQ(
      std::memcmp(static_cast<const char*>(down->raw()) + 5 * q5.nbytes(), q5.raw(), q5.nbytes()),
      0);
  EXPECT_EQ(std::memcmp(fp8_matrix_scales(*down).select(5).raw(), s5.raw(), s5.nbytes()), 0);
  // lm_head is bf16 in the checkpoint: kept bf16; kv_b_proj is read by the attention op: f32.
  EXPECT_EQ(arena.find("lm_head.weight")->dtype(), DType::kBF16);
  EXPECT_EQ(arena.find("layers.0.mla.kv_b_proj.weight")->dtype(), DType::kF32);
  EXPECT_EQ(checked, 4);

  auto f32 = Model::load(dir, Placement{.dtype = WeightDType::kF32});
  ASSERT_TRUE(f32.ok()) << f32.status();
  expect_dequantized_logits(**m, **f32, "deepseek_v3_fp8");
  std::printf("deepseek_v3_fp8: arena f32 placement %zu bytes, fp8 (auto) %zu bytes (%.3f)\n",
              (*f32)->parameters().bytes(), arena.bytes(),
              double(arena.bytes()) / (*f32)->parameters().bytes());
}

// A bf16 checkpoint quantized at load: the logits are the f32 model's of the quantized values, and
// the matrices take half their bf16 bytes plus the scales.
TEST(Fp8Model, Bf16CheckpointQuantizedAtLoad) {
  const std::string fixture = "kimi_linear_b0", dir = kFixtures + "/" + fixture;
  auto fp8 = Model::load(dir, Placement{.dtype = WeightDType::kFP8});
  auto bf16 = Model::load(dir, Placement{.dtype = WeightDType::kBF16});
  auto f32 = Model::load(dir, Placement{.dtype = WeightDType::kF32});
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_TRUE(f32.ok()) << f32.status();
  const ParameterArena& a = (*fp8)->parameters();
  const ParameterArena& b = (*bf16)->parameters();
  // Every bf16 matrix of the bf16 placement is an FP8 one here, and nothing else changed.
  size_t values = 0, scales = 0, matrices = 0;
  double err2 = 0, ref2 = 0;
  for (const ParameterArena::Entry& e : b.entries()) {
    const Tensor* t = a.find(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    ASSERT_EQ(t->shape(), e.tensor.shape());
    if (e.tensor.dtype() != DType::kBF16) {
      EXPECT_EQ(t->dtype(), e.tensor.dtype()) << e.name;
      continue;
    }
    ASSERT_EQ(t->dtype(), DType::kF8E4M3) << e.name;
    ++matrices;
    values += t->nbytes();
    scales += fp8_matrix_scales(*t).nbytes();
    const Tensor w = *dequantize_fp8_blocks(*t, fp8_matrix_scales(*t), 128, 128, e.name);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double ref = bf16_to_f32(e.tensor.data<uint16_t>()[i]);
      err2 += (w.data<float>()[i] - ref) * (w.data<float>()[i] - ref);
      ref2 += ref * ref;
    }
  }
  EXPECT_GT(matrices, 10u);
  EXPECT_EQ(2 * values, b.bytes(DType::kBF16));
  // The arena's FP8 bytes: the values, the scales and at most 32 bytes of trailer per matrix.
  EXPECT_GE(a.bytes(DType::kF8E4M3), values + scales);
  EXPECT_LE(a.bytes(DType::kF8E4M3), values + scales + 32 * matrices);
  EXPECT_LE(double(a.bytes(DType::kF8E4M3)), 0.5 * b.bytes(DType::kBF16) * 1.02);
  EXPECT_EQ(a.bytes(DType::kF32), b.bytes(DType::kF32));
  std::printf(
      "%s: %zu matrices, bf16 %zu bytes -> fp8 %zu bytes (values %zu + scales %zu; %.4f "
      "of bf16); whole arena f32 %zu, bf16 %zu, fp8 %zu; quantization rel L2 %.4g\n",
      fixture.c_str(), matrices, b.bytes(DType::kBF16), a.bytes(DType::kF8E4M3), values, scales,
      double(a.bytes(DType::kF8E4M3)) / b.bytes(DType::kBF16), (*f32)->parameters().bytes(),
      b.bytes(), a.bytes(), std::sqrt(err2 / ref2));
  EXPECT_LT(std::sqrt(err2 / ref2), 0.04);
  expect_dequantized_logits(**fp8, *dequantized_copy(**fp8, "fp8_kimi_dequantized"), fixture);
}

// loom-convert of an FP8 checkpoint (auto, and fp8) writes the tensors and scales as they are; the
// converted checkpoint loads FP8 again and gives the same logits bit for bit.
TEST(Fp8Model, ConvertKeepsFp8) {
  const std::string src = kFixtures + "/deepseek_v3_fp8";
  auto orig = Model::load(src, Placement{.dtype = WeightDType::kAuto});
  ASSERT_TRUE(orig.ok()) << orig.status();
  for (WeightDType dtype : {WeightDType::kAuto, WeightDType::kFP8}) {
    const std::string dir = kTmp + "/fp8_convert_" + std::string(weight_dtype_name(dtype));
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(convert_to_native(src, dir, ExportOptions{.matrices = dtype}).ok());
    auto file = SafetensorsFile::open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    const SafetensorsFile::Entry* s = (*file)->find("layers.1.moe.experts.gate_scale_inv");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->dtype, DType::kF32);
    EXPECT_EQ(s->shape, Shape({16, 1, 1}));
    EXPECT_EQ((*file)->find("layers.1.moe.experts.gate")->dtype, DType::kF8E4M3);
    // lm_head: bf16 in the checkpoint; auto keeps it, fp8 quantizes it.
    EXPECT_EQ((*file)->find("lm_head.weight")->dtype,
              dtype == WeightDType::kAuto ? DType::kBF16 : DType::kF8E4M3);
    auto conv = Model::load(dir, Placement{.dtype = WeightDType::kAuto});
    ASSERT_TRUE(conv.ok()) << conv.status();
    EXPECT_EQ((*conv)->placement().dtype, WeightDType::kFP8);
    for (const ParameterArena::Entry& e : (*orig)->parameters().entries()) {
      if (e.tensor.dtype() != DType::kF8E4M3) continue;
      const Tensor* t = (*conv)->parameters().find(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      ASSERT_EQ(t->dtype(), DType::kF8E4M3) << e.name;
      EXPECT_EQ(std::memcmp(t->raw(), e.tensor.raw(), e.tensor.nbytes()), 0) << e.name;
      EXPECT_EQ(std::memcmp(fp8_matrix_scales(*t).raw(), fp8_matrix_scales(e.tensor).raw(),
                            fp8_matrix_scales(e.tensor).nbytes()),
                0)
          << e.name;
    }
    if (dtype == WeightDType::kAuto) {
      const std::vector<int32_t> ids = prompt("deepseek_v3_fp8", 0);
      const std::vector<float> a = run(**orig, ids, false), b = run(**conv, ids, false);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
  }
}

TEST(Fp8Model, PlacementsResolvedAndRefused) {
  const std::string dir = kFixtures + "/deepseek_v3_fp8";
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok());
  auto w = WeightLoader::open(dir, *cfg);
  ASSERT_TRUE(w.ok());
  // On a GPU (resolved only: nothing is loaded, so no device is needed), auto keeps FP8 unless
  // f32 activations ask for the f32 path.
  ParameterArena gpu(Device::kCuda);
  for (const ActivationDType act :
       {ActivationDType::kAuto, ActivationDType::kBF16, ActivationDType::kF32}) {
    auto placed = w->placed(
        gpu, Placement{.device = Device::kCuda, .dtype = WeightDType::kAuto, .activations = act});
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->placement().dtype,
              act == ActivationDType::kF32 ? WeightDType::kF32 : WeightDType::kFP8)
        << activation_dtype_name(act);
  }
  auto explicit_fp8 =
      w->placed(gpu, Placement{.device = Device::kCuda, .dtype = WeightDType::kFP8});
  ASSERT_TRUE(explicit_fp8.ok()) << explicit_fp8.status();
  // A bf16 checkpoint with bf16 activations on a GPU: bf16 matrices, as before.
  const std::string b0 = kFixtures + "/kimi_linear_b0";
  auto b0_cfg = load_model_config(b0);
  ASSERT_TRUE(b0_cfg.ok());
  auto b0_w = WeightLoader::open(b0, *b0_cfg);
  ASSERT_TRUE(b0_w.ok());
  ParameterArena gpu_b0(Device::kCuda);
  auto b0_placed = b0_w->placed(gpu_b0, Placement{.device = Device::kCuda,
                                                  .dtype = WeightDType::kAuto,
                                                  .activations = ActivationDType::kBF16});
  ASSERT_TRUE(b0_placed.ok()) << b0_placed.status();
  EXPECT_EQ(b0_placed->placement().dtype, WeightDType::kBF16);
  ParameterArena cpu(Device::kCpu);
  auto trainable = w->placed(cpu, Placement{.dtype = WeightDType::kFP8, .trainable = true});
  EXPECT_FALSE(trainable.ok());
  // A trainable auto placement keeps f32 (dequantized) matrices.
  auto train_auto = w->placed(cpu, Placement{.dtype = WeightDType::kAuto, .trainable = true});
  ASSERT_TRUE(train_auto.ok());
  EXPECT_EQ(train_auto->placement().dtype, WeightDType::kF32);
}

}  // namespace
}  // namespace loom
