#include "trainer/rl/routing_replay.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

int64_t row_size(const Trajectory& tr) {
  return static_cast<int64_t>(tr.routed_layers) * tr.routed_top_k;
}

bool routed(const Trajectory& tr, int64_t position) {
  return tr.routed_experts[static_cast<size_t>(position * row_size(tr))] >= 0;
}

// A hash of tokens[0..p] for every p (FNV-1a style over the ids, chained).
std::vector<uint64_t> prefix_hashes(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t acc = 1469598103934665603ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    acc = (acc ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
    h[i] = acc;
  }
  return h;
}

}  // namespace

absl::Status add_routed_experts(std::span<const RoutedExperts> runs, Trajectory& tr) {
  for (const RoutedExperts& run : runs) {
    if (run.rows == 0) continue;
    const int64_t per_row = static_cast<int64_t>(run.expert_ids.size()) / run.rows;
    if (row_size(tr) == 0 || per_row != row_size(tr) ||
        per_row * run.rows != static_cast<int64_t>(run.expert_ids.size()))
      return absl::InvalidArgumentError(
          absl::StrCat("routing record: a run of ", run.rows, " rows with ", run.expert_ids.size(),
                       " ids for ", tr.routed_layers, " layers of top-", tr.routed_top_k));
    const size_t end = static_cast<size_t>((run.first_position + run.rows) * per_row);
    if (tr.routed_experts.size() < end) tr.routed_experts.resize(end, -1);
    std::copy(run.expert_ids.begin(), run.expert_ids.end(),
              tr.routed_experts.begin() + run.first_position * per_row);
  }
  return absl::OkStatus();
}

int64_t fill_shared_prefix_routing(std::vector<Trajectory>& trajectories) {
  for (Trajectory& tr : trajectories)
    tr.routed_experts.resize(tr.tokens.size() * static_cast<size_t>(row_size(tr)), -1);
  // Where each routed prefix can be read: (hash of tokens[0..p]) -> (trajectory, p).
  std::vector<std::vector<uint64_t>> hashes;
  absl::flat_hash_map<uint64_t, std::pair<size_t, int64_t>> source;
  for (size_t i = 0; i < trajectories.size(); ++i) {
    const Trajectory& tr = trajectories[i];
    hashes.push_back(prefix_hashes(tr.tokens));
    if (row_size(tr) == 0) continue;
    for (int64_t p = 0; p < static_cast<int64_t>(tr.tokens.size()); ++p)
      if (routed(tr, p)) source.try_emplace(hashes[i][static_cast<size_t>(p)], i, p);
  }
  int64_t filled = 0;
  for (size_t i = 0; i < trajectories.size(); ++i) {
    Trajectory& tr = trajectories[i];
    const int64_t w = row_size(tr);
    if (w == 0) continue;
    for (int64_t p = 0; p < static_cast<int64_t>(tr.tokens.size()); ++p) {
      if (routed(tr, p)) continue;
      auto it = source.find(hashes[i][static_cast<size_t>(p)]);
      if (it == source.end()) continue;
      const Trajectory& from = trajectories[it->second.first];
      // The hash names a candidate; the tokens decide (a collision fills nothing).
      if (it->second.second != p || row_size(from) != w ||
          !std::equal(tr.tokens.begin(), tr.tokens.begin() + p + 1, from.tokens.begin()))
        continue;
      std::copy_n(from.routed_experts.begin() + p * w, w, tr.routed_experts.begin() + p * w);
      ++filled;
    }
  }
  return filled;
}

absl::StatusOr<RoutingReplay> routing_replay_of(const Trajectory& tr, const ModelConfig& cfg,
                                                bool apply) {
  std::vector<int> moe_layers;
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.ffns[static_cast<size_t>(l)] == FfnType::kMoe) moe_layers.push_back(l);
  const int64_t n = static_cast<int64_t>(tr.tokens.size()), k = cfg.moe.top_k;
  const int64_t layers = static_cast<int64_t>(moe_layers.size());
  if (tr.routed_layers != layers || tr.routed_top_k != k ||
      static_cast<int64_t>(tr.routed_experts.size()) != n * layers * k)
    return absl::InvalidArgumentError(
        absl::StrCat("routing replay: a trajectory of ", n, " tokens recorded ",
                     tr.routed_experts.size(), " ids for ", tr.routed_layers, " layers of top-",
                     tr.routed_top_k, "; the model has ", layers, " MoE layers of top-", k));
  RoutingReplay replay;
  replay.apply = apply;
  replay.expert_ids.resize(static_cast<size_t>(cfg.num_layers));
  for (int64_t j = 0; j < layers; ++j) {
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    int32_t* out = ids.data<int32_t>();
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(tr.routed_experts.begin() + (t * layers + j) * k, k, out + t * k);
    replay.expert_ids[static_cast<size_t>(moe_layers[static_cast<size_t>(j)])] = ids;
  }
  return replay;
}

double routing_coverage(const Trajectory& tr) {
  const int64_t n = static_cast<int64_t>(tr.tokens.size()) - 1;
  if (n <= 0 || row_size(tr) == 0 ||
      static_cast<int64_t>(tr.routed_experts.size()) < (n + 1) * row_size(tr))
    return 0.0;
  int64_t covered = 0;
  for (int64_t p = 0; p < n; ++p) covered += routed(tr, p);
  return static_cast<double>(covered) / static_cast<double>(n);
}

}  // namespace loom
