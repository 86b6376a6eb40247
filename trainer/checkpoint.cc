#include "trainer/checkpoint.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/native_export.h"
#include "weights/safetensors.h"

namespace loom {

namespace fs = std::filesystem;

absl::Status save_checkpoint(const std::string& dir, const Model& model, const TrainStep& step,
                             const TrainerMetadata& metadata,
                             const std::vector<std::string>& copy_files) {
  const fs::path final_dir(dir), tmp(dir + ".tmp"), old(dir + ".old");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: cannot create ", tmp.string()));
  WeightLoader::Record params;
  for (const ParameterArena::Entry& e : model.parameters().entries())
    params.emplace_back(e.name, e.tensor.to(Device::kCpu));  // a GPU run's weights come back
  LOOM_RETURN_IF_ERROR(write_native_checkpoint(model.config(), params, tmp.string()));
  LOOM_RETURN_IF_ERROR(
      write_safetensors((tmp / "trainer_state.safetensors").string(), step.state(), metadata));
  for (const std::string& f : copy_files) {
    fs::copy_file(f, tmp / fs::path(f).filename(), fs::copy_options::overwrite_existing, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("checkpoint: cannot copy ", f, ": ", ec.message()));
  }
  // Swap in: the old checkpoint moves aside first, so a crash leaves one complete folder.
  fs::remove_all(old, ec);
  if (fs::exists(final_dir)) fs::rename(final_dir, old, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: cannot move ", dir, " aside"));
  fs::rename(tmp, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: cannot rename into ", dir));
  fs::remove_all(old, ec);
  return absl::OkStatus();
}

absl::StatusOr<TrainerMetadata> load_trainer_state(const std::string& dir, TrainStep& step) {
  LOOM_ASSIGN_OR_RETURN(
      auto file, SafetensorsFile::open((fs::path(dir) / "trainer_state.safetensors").string()));
  std::vector<std::pair<std::string, Tensor>> state;
  for (const std::string& name : file->names()) {
    LOOM_ASSIGN_OR_RETURN(Tensor t, file->get(name));
    state.emplace_back(name, t);
  }
  LOOM_RETURN_IF_ERROR(step.restore(state));
  return TrainerMetadata(file->metadata().begin(), file->metadata().end());
}

}  // namespace loom
