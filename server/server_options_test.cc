// The limits whose defaults depend on the device (server/server_options.h): left as kByDevice by
// the flags, resolved to the CPU's or a GPU's values, explicit values kept, and out-of-range values
// refused with the flag's name; the prefix cache's host tier in MiB (1024 by default, 0 off,
// negative refused).
#include "server/server_options.h"

#include <filesystem>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(int, max_num_batched_tokens);
ABSL_DECLARE_FLAG(int, checkpoint_interval);
ABSL_DECLARE_FLAG(int64_t, prefix_offload_mb);

namespace loom {
namespace {

// --model must name an existing directory (the flags check it; these tests load nothing from it):
// the default, build/default-model, exists only once `make run` has made it.
class ModelDirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::SetFlag(&FLAGS_model, std::filesystem::temp_directory_path().string());
  }
};
::testing::Environment* const kModelDir =
    ::testing::AddGlobalTestEnvironment(new ModelDirEnvironment);

TEST(ServerOptions, LimitsDefaultByDevice) {
  absl::StatusOr<ServerOptions> o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine.max_num_batched_tokens, kByDevice);
  EXPECT_EQ(o->engine.max_model_len, kByDevice);
  EngineOptions cpu = o->engine, gpu = o->engine;
  apply_device_defaults(Device::kCpu, cpu);
  EXPECT_EQ(cpu.max_num_batched_tokens, 2048);
  EXPECT_EQ(cpu.max_model_len, 8192);
  apply_device_defaults(Device::cuda(0), gpu);
  EXPECT_EQ(gpu.max_num_batched_tokens, 8192);
  EXPECT_EQ(gpu.max_model_len, 0);  // the model's max_position_embeddings
  EXPECT_EQ(o->engine.checkpoint_interval, kByDevice);
  EXPECT_EQ(cpu.checkpoint_interval, 8);
  EXPECT_EQ(gpu.checkpoint_interval, 8192 / 64);  // a checkpoint a full prefill chunk
}

TEST(ServerOptions, CheckpointIntervalFollowsTheStepOnAGpu) {
  absl::SetFlag(&FLAGS_max_num_batched_tokens, 1000);
  absl::StatusOr<ServerOptions> o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  EngineOptions gpu = o->engine, cpu = o->engine;
  apply_device_defaults(Device::cuda(0), gpu);
  EXPECT_EQ(gpu.checkpoint_interval, 15);  // whole 64-token blocks of a step
  apply_device_defaults(Device::kCpu, cpu);
  EXPECT_EQ(cpu.checkpoint_interval, 8);
  absl::SetFlag(&FLAGS_max_num_batched_tokens, 40);  // less than a block: every block
  o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  gpu = o->engine;
  apply_device_defaults(Device::cuda(0), gpu);
  EXPECT_EQ(gpu.checkpoint_interval, 1);
  absl::SetFlag(&FLAGS_max_num_batched_tokens, -1);
}

TEST(ServerOptions, ExplicitLimitsStay) {
  absl::SetFlag(&FLAGS_max_num_batched_tokens, 512);
  absl::SetFlag(&FLAGS_checkpoint_interval, 3);
  absl::SetFlag(&FLAGS_max_model_len, 0);
  absl::StatusOr<ServerOptions> o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  for (Device d : {Device::kCpu, Device::cuda(0)}) {
    EngineOptions e = o->engine;
    apply_device_defaults(d, e);
    EXPECT_EQ(e.max_num_batched_tokens, 512);
    EXPECT_EQ(e.max_model_len, 0);
    EXPECT_EQ(e.checkpoint_interval, 3);
  }
  absl::SetFlag(&FLAGS_max_num_batched_tokens, -1);
  absl::SetFlag(&FLAGS_max_model_len, -1);
  absl::SetFlag(&FLAGS_checkpoint_interval, -1);
}

TEST(ServerOptions, OutOfRangeLimitsAreRefused) {
  absl::SetFlag(&FLAGS_max_model_len, -2);
  absl::StatusOr<ServerOptions> o = server_options_from_flags();
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--max_model_len"), std::string::npos) << o.status();
  absl::SetFlag(&FLAGS_max_model_len, -1);
  absl::SetFlag(&FLAGS_max_num_batched_tokens, 0);
  o = server_options_from_flags();
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--max_num_batched_tokens"), std::string::npos) << o.status();
  absl::SetFlag(&FLAGS_max_num_batched_tokens, -1);
  for (int bad : {0, -2}) {
    absl::SetFlag(&FLAGS_checkpoint_interval, bad);
    o = server_options_from_flags();
    EXPECT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("--checkpoint_interval"), std::string::npos) << o.status();
  }
  absl::SetFlag(&FLAGS_checkpoint_interval, -1);
}

TEST(ServerOptions, PrefixOffloadInMib) {
  absl::StatusOr<ServerOptions> o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine.prefix_offload_bytes, int64_t{1024} << 20);
  absl::SetFlag(&FLAGS_prefix_offload_mb, 0);
  o = server_options_from_flags();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine.prefix_offload_bytes, 0);
  absl::SetFlag(&FLAGS_prefix_offload_mb, -1);
  o = server_options_from_flags();
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--prefix_offload_mb"), std::string::npos) << o.status();
  absl::SetFlag(&FLAGS_prefix_offload_mb, 1024);
}

}  // namespace
}  // namespace loom
