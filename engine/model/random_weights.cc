#include "engine/model/random_weights.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/model.h"
#include "kernels/exec.h"
#include "kernels/random_fill.h"

namespace loom {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

RandomInit uniform_range(double lo, double hi) {
  return {static_cast<float>((lo + hi) / 2), static_cast<float>((hi - lo) / 2)};
}

// Uniform with variance `var`: half-width sqrt(3 var).
RandomInit with_variance(double var) { return {0.0f, static_cast<float>(std::sqrt(3.0 * var))}; }

}  // namespace

absl::StatusOr<RandomInit> random_init(const ModelConfig& cfg, std::string_view canonical,
                                       const Shape& full) {
  if (ends_with(canonical, "norm.weight")) {
    // The decoder's own norms (and GQA's q/k norms) add norm_weight_offset to their weight.
    const bool offset_norm =
        ends_with(canonical, "mixer_norm.weight") || ends_with(canonical, "ffn_norm.weight") ||
        canonical == "final_norm.weight" || ends_with(canonical, "gqa.q_norm.weight") ||
        ends_with(canonical, "gqa.k_norm.weight");
    return RandomInit{offset_norm ? 1.0f - cfg.norm_weight_offset : 1.0f, 0.0f};
  }
  if (ends_with(canonical, "res_proj.weight") || ends_with(canonical, ".bias")) return RandomInit{};
  if (ends_with(canonical, "A_log")) return uniform_range(0.0, std::log(16.0));
  if (ends_with(canonical, "gdn.dt_bias")) return RandomInit{1.0f, 0.0f};
  if (ends_with(canonical, "kda.dt_bias"))
    return uniform_range(std::log(std::expm1(1e-3)), std::log(std::expm1(0.1)));
  if (full.ndim() < 2 || full[full.ndim() - 1] <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("random weights: no rule for '", absl_sv(canonical), "' ", full.to_string()));
  const double fan_in = static_cast<double>(full[full.ndim() - 1]);
  if (ends_with(canonical, "conv.weight"))
    return RandomInit{0.0f, static_cast<float>(1 / std::sqrt(fan_in))};
  // A tied table is also the output projection: it gets the matrices' variance.
  if (canonical == "embed.weight")
    return with_variance(cfg.tie_word_embeddings ? 1.0 / fan_in : 1.0);
  return with_variance(1.0 / fan_in);
}

absl::StatusOr<uint64_t> parse_random_weights_seed(std::string_view text) {
  uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, seed, 10);
  if (text.empty() || ec != std::errc() || ptr != end || text[0] == '+' || text[0] == '-')
    return absl::InvalidArgumentError(
        absl::StrCat("--random_weights: '", absl_sv(text),
                     "' is not a seed (a decimal integer in [0, 18446744073709551615])"));
  return seed;
}

absl::StatusOr<ModelConfig> load_random_weights_config(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    if (!std::filesystem::exists(p / "config.json", ec))
      return absl::NotFoundError(absl::StrCat("--random_weights: ", path, " has no config.json"));
    return load_model_config(path);
  }
  if (!std::filesystem::is_regular_file(p, ec))
    return absl::NotFoundError(absl::StrCat(
        "--random_weights: ", path, " is neither a config.json file nor a directory holding one"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("--random_weights: cannot read ", path));
  absl::StatusOr<ModelConfig> cfg = parse_model_config(text.str());
  if (!cfg.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", cfg.status().message()));
  return cfg;
}

std::string random_weights_model_dir(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

WeightLoader random_weight_loader(const ModelConfig& cfg, uint64_t seed) {
  return WeightLoader::generated(
      cfg,
      [cfg, seed](std::string_view canonical, const Shape& full, ExpertRange rows,
                  const Tensor& dst) -> absl::Status {
        // Counters run over the whole tensor, so a rank holding some experts gets the same rows
        // as a rank holding all of them.
        const int64_t row_elems = full.ndim() > 0 && full[0] > 0 ? full.numel() / full[0] : 0;
        // Tied embeddings: lm_head holds the embedding's values, as the checkpoint loader maps
        // both names to one tensor.
        const std::string_view name =
            cfg.tie_word_embeddings && canonical == "lm_head.weight" ? "embed.weight" : canonical;
        LOOM_ASSIGN_OR_RETURN(const RandomInit init, random_init(cfg, name, full));
        const RandomFillParams p{.key = random_fill_key(seed, name),
                                 .first = rows.begin * row_elems,
                                 .center = init.center,
                                 .half_width = init.half_width};
        random_fill(exec_for(dst.device()), dst, p);
        return absl::OkStatus();
      });
}

absl::StatusOr<std::unique_ptr<Model>> Model::load_random(const std::string& path, uint64_t seed,
                                                          const Placement& placement) {
  LOOM_ASSIGN_OR_RETURN(const ModelConfig cfg, load_random_weights_config(path));
  Placement p = placement;
  // kAuto: bf16 matrices on a GPU (a production-sized model fits only so), f32 on the host (the
  // CPU reference computes in f32 either way).
  if (p.dtype == WeightDType::kAuto)
    p.dtype = p.device.is_cpu() ? WeightDType::kF32 : WeightDType::kBF16;
  return load(cfg, random_weight_loader(cfg, seed), p);
}

}  // namespace loom
