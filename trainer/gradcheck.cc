#include "trainer/gradcheck.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/gradients.h"
#include "engine/model/model.h"
#include "nlohmann/json.hpp"
#include "weights/safetensors.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// A folder whose checkpoint is the fixture's gradients: config.json and model.safetensors are
// links to the fixture's config.json and grads.safetensors. Removed on destruction.
class GradientCheckpointDir {
 public:
  static absl::StatusOr<GradientCheckpointDir> make(const std::string& fixture) {
    const fs::path grads = fs::path(fixture) / "grads.safetensors";
    if (!fs::exists(grads))
      return absl::NotFoundError(absl::StrCat("gradcheck: ", grads.string(), " does not exist"));
    GradientCheckpointDir dir;
    dir.path_ = fs::temp_directory_path() /
                absl::StrCat("loom-gradcheck-", ::getpid(), "-", reinterpret_cast<uintptr_t>(&dir));
    std::error_code ec;
    fs::create_directories(dir.path_, ec);
    fs::create_symlink(fs::absolute(fs::path(fixture) / "config.json"), dir.path_ / "config.json",
                       ec);
    if (!ec) fs::create_symlink(fs::absolute(grads), dir.path_ / "model.safetensors", ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("gradcheck: cannot link into ", dir.path_.string(), ": ", ec.message()));
    return dir;
  }
  GradientCheckpointDir() = default;
  GradientCheckpointDir(GradientCheckpointDir&& o) noexcept : path_(std::move(o.path_)) {
    o.path_.clear();
  }
  ~GradientCheckpointDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

}  // namespace

absl::StatusOr<GradcheckReport> gradcheck_fixture(const std::string& fixture_dir, Device device) {
  LOOM_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(fixture_dir));
  LOOM_ASSIGN_OR_RETURN(WeightLoader weights, WeightLoader::open(fixture_dir, cfg));
  WeightLoader::Record params;  // every parameter the model loads, canonical name and shape
  weights.set_recorder(&params);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        Model::load(cfg, weights,
                                    Placement{.device = device,
                                              .dtype = WeightDType::kF32,
                                              .activations = ActivationDType::kF32}));

  GradcheckReport report;
  std::ifstream golden_json(fs::path(fixture_dir) / "golden.json");
  if (!golden_json)
    return absl::NotFoundError(absl::StrCat("gradcheck: no golden.json in ", fixture_dir));
  const nlohmann::json golden = nlohmann::json::parse(golden_json, nullptr, false);
  if (!golden.is_object() || !golden.contains("loss_1") || !golden["loss_1"].is_number())
    return absl::InvalidArgumentError("gradcheck: golden.json has no numeric loss_1");
  report.ref_loss = golden["loss_1"].get<double>();
  LOOM_ASSIGN_OR_RETURN(
      auto golden_file,
      SafetensorsFile::open((fs::path(fixture_dir) / "golden.safetensors").string()));
  LOOM_ASSIGN_OR_RETURN(Tensor ids, golden_file->get("input_ids_1"));
  if (ids.dtype() != DType::kI64 || ids.ndim() != 1)
    return absl::InvalidArgumentError("gradcheck: input_ids_1 must be i64 [T]");
  std::vector<int32_t> tokens(ids.dim(0));
  for (int64_t t = 0; t < ids.dim(0); ++t) tokens[t] = static_cast<int32_t>(ids.data<int64_t>()[t]);

  Gradients grads(device);
  LOOM_ASSIGN_OR_RETURN(report.loss, model->loss_and_gradients(tokens, grads));

  LOOM_ASSIGN_OR_RETURN(GradientCheckpointDir ref_dir, GradientCheckpointDir::make(fixture_dir));
  LOOM_ASSIGN_OR_RETURN(WeightLoader ref, WeightLoader::open(ref_dir.path(), cfg));
  for (const auto& [name, weight] : params) {
    LOOM_ASSIGN_OR_RETURN(Tensor want, ref.load(name, weight.shape()));
    const Tensor want32 = want.to_f32();
    const Tensor* found = grads.find(name);
    const Tensor got_host = found ? found->to(Device::kCpu) : Tensor();
    const Tensor* got = found ? &got_host : nullptr;
    GradcheckTensor row;
    row.name = name;
    double num = 0, den = 0;
    for (int64_t i = 0; i < want32.numel(); ++i) {
      const double w = want32.data<float>()[i];
      const double g = got ? got->data<float>()[i] : 0.0;
      num += (g - w) * (g - w);
      den += w * w;
      row.max_abs = std::max(row.max_abs, std::fabs(g - w));
    }
    row.ref_norm = std::sqrt(den);
    row.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    report.tensors.push_back(row);
  }
  return report;
}

}  // namespace loom
