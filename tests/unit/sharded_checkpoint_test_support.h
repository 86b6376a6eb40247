// Shared by the expert-parallel tests: a sharded copy of a fixture checkpoint (experts spread over
// shard files with an index), optionally without one expert, to load ranks from.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "weights/safetensors.h"

namespace loom {

// The expert a checkpoint tensor belongs to ("...experts.5.w1.weight" -> 5), or -1.
inline int checkpoint_expert_of(const std::string& name) {
  const size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  return std::atoi(name.c_str() + at + 9);
}

// A sharded copy of fixture `src` in `dst`: the tensors of expert e of every layer in shard
// experts-(e % 3), everything else in shard rest, and model.safetensors.index.json mapping them;
// without expert `skip` (-1: none) anywhere.
inline void write_sharded_checkpoint(const std::string& src, const std::string& dst, int skip) {
  std::filesystem::remove_all(dst);
  std::filesystem::create_directories(dst);
  for (const char* f : {"config.json", "generation_config.json"})
    if (std::filesystem::exists(src + "/" + f))
      std::filesystem::copy_file(src + "/" + f, dst + "/" + f);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(4);  // 0..2 experts, 3 rest
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : (*file)->names()) {
    const int e = checkpoint_expert_of(name);
    if (e >= 0 && e == skip) continue;
    const int shard = e >= 0 ? e % 3 : 3;
    shards[shard].emplace_back(name, *(*file)->get(name));
    map[name] = shard < 3 ? absl::StrCat("experts-", shard, ".safetensors") : "rest.safetensors";
  }
  for (int s = 0; s < 4; ++s) {
    const std::string name =
        s < 3 ? absl::StrCat("experts-", s, ".safetensors") : "rest.safetensors";
    ASSERT_TRUE(write_safetensors(dst + "/" + name, shards[s]).ok());
  }
  std::ofstream(dst + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}};
}

}  // namespace loom
