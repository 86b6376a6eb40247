// Tests of weights/safetensors: the fixtures' checkpoints, write/read round trips, sharded
// checkpoints and malformed inputs.
#include "weights/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kFixtures = LOOM_FIXTURES_DIR;

// A fresh, empty scratch directory for the current test.
fs::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(LOOM_TEST_TMPDIR) / "safetensors_test" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length + header + `data_bytes` bytes of data (0, 1, 2, ...).
std::string make_image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i));
  return out;
}

std::string raw_length(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

Tensor random_tensor(Shape shape, DType dtype, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = a.is_contiguous() ? a : a.clone();
  Tensor cb = b.is_contiguous() ? b : b.clone();
  return a.nbytes() == 0 || std::memcmp(ca.raw(), cb.raw(), ca.nbytes()) == 0;
}

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kFixtures, ec))
    if (fs::exists(e.path() / "model.safetensors") && fs::exists(e.path() / "golden.json"))
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// ----------------------------------------------------------------------------------------------
// Fixtures

TEST(SafetensorsFixtures, EveryFixtureMatchesGoldenWeightListing) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty()) << "no fixtures under " << kFixtures;
  for (const fs::path& dir : dirs) {
    SCOPED_TRACE(dir.string());
    const json golden = json::parse(read_file(dir / "golden.json"));
    ASSERT_TRUE(golden.contains("weights"));
    const json& weights = golden["weights"];

    auto file = SafetensorsFile::open((dir / "model.safetensors").string());
    ASSERT_TRUE(file.ok()) << file.status();
    const auto names = (*file)->names();
    EXPECT_EQ(names.size(), weights.size());
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_EQ((*file)->metadata().count("format"), 1u);

    // Storage dtypes: f32 fixtures; bf16 ones (`weights_dtype`); the FP8 one lists its counts.
    const std::string weights_dtype = golden.value("weights_dtype", std::string("float32"));
    std::map<std::string, int> counts;
    for (const auto& [name, shape_json] : weights.items()) {
      SCOPED_TRACE(name);
      const auto* entry = (*file)->find(name);
      ASSERT_NE(entry, nullptr);
      Shape expected;
      for (const auto& d : shape_json) expected.push_back(d.get<int64_t>());
      EXPECT_EQ(entry->shape, expected);
      const std::string dt = entry->dtype == DType::kF32      ? "float32"
                             : entry->dtype == DType::kBF16   ? "bfloat16"
                             : entry->dtype == DType::kF8E4M3 ? "float8_e4m3fn"
                                                              : "other";
      ++counts[dt];
      if (!golden.contains("checkpoint_dtype_counts")) EXPECT_EQ(dt, weights_dtype);
    }
    if (golden.contains("checkpoint_dtype_counts"))
      EXPECT_EQ(json(counts), golden["checkpoint_dtype_counts"]);

    // A few tensors: zero-copy views with the right shape, finite values.
    int checked = 0;
    for (const auto& name : names) {
      if (checked++ == 5) break;
      auto t = (*file)->get(name);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->dtype(), (*file)->find(name)->dtype);
      EXPECT_EQ(t->shape(), (*file)->find(name)->shape);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % dtype_size(t->dtype()), 0u);
      const Tensor f = t->to_f32();
      for (int64_t i = 0; i < f.numel(); ++i) ASSERT_TRUE(std::isfinite(f.data<float>()[i]));
    }

    auto ck = Checkpoint::open(dir.string());
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->names(), names);
  }
}

TEST(SafetensorsFixtures, TensorKeepsMappingAlive) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  const std::string path = (dirs[0] / "model.safetensors").string();
  Tensor t;
  std::vector<float> copy;
  {
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const std::string name = (*file)->names().front();
    auto got = (*file)->get(name);
    ASSERT_TRUE(got.ok());
    t = *got;
    copy.assign(t.data<float>(), t.data<float>() + t.numel());
  }  // file destroyed; the mapping must survive through t
  ASSERT_EQ(static_cast<size_t>(t.numel()), copy.size());
  EXPECT_EQ(std::memcmp(t.raw(), copy.data(), copy.size() * sizeof(float)), 0);
}

// ----------------------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsWrite, RoundTripIsBitExact) {
  const fs::path dir = scratch_dir();
  std::mt19937_64 rng(1234);
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", random_tensor({3, 5}, DType::kF32, rng)},
      {"bf16", random_tensor({7}, DType::kBF16, rng)},
      {"f16", random_tensor({2, 3, 4}, DType::kF16, rng)},
      {"i32", random_tensor({4, 4}, DType::kI32, rng)},
      {"i64", random_tensor({5}, DType::kI64, rng)},
      {"u8_odd", random_tensor({13}, DType::kU8, rng)},  // makes the next one unaligned
      {"f32_after_u8", random_tensor({2, 2}, DType::kF32, rng)},
      {"scalar", random_tensor({}, DType::kF32, rng)},
      {"empty", random_tensor({0, 3}, DType::kBF16, rng)},
      {"a_last_but_sorted_first", random_tensor({1, 6}, DType::kI64, rng)},
  };
  // A non-contiguous view (every other column) is packed on write.
  Tensor wide = random_tensor({4, 6}, DType::kF32, rng);
  tensors.emplace_back("sliced", wide.slice(1, 1, 4));
  ASSERT_FALSE(tensors.back().second.is_contiguous());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo"}};

  const std::string path = (dir / "rt.safetensors").string();
  ASSERT_TRUE(write_safetensors(path, tensors, metadata).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // Header length is a multiple of 8 and keys keep the given order.
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  size_t last = 0;
  for (const auto& [name, t] : tensors) {
    const size_t pos = header.find("\"" + name + "\"");
    ASSERT_NE(pos, std::string::npos) << name;
    EXPECT_GT(pos, last) << name << " out of order";
    last = pos;
  }

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), metadata);
  EXPECT_EQ((*file)->names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    auto got = (*file)->get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got->raw()) % dtype_size(got->dtype()), 0u);
    EXPECT_TRUE(same_bytes(*got, t));
  }

  // Same through from_bytes.
  auto mem = SafetensorsFile::from_bytes(bytes, "mem");
  ASSERT_TRUE(mem.ok()) << mem.status();
  for (const auto& [name, t] : tensors) {
    auto got = (*mem)->get(name);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(same_bytes(*got, t)) << name;
  }
}

TEST(SafetensorsWrite, OverwritesAtomicallyAndReportsIoErrors) {
  const fs::path dir = scratch_dir();
  const std::string path = (dir / "x.safetensors").string();
  std::mt19937_64 rng(7);
  ASSERT_TRUE(write_safetensors(path, {{"a", random_tensor({8}, DType::kF32, rng)}}).ok());
  Tensor b = random_tensor({2}, DType::kI32, rng);
  ASSERT_TRUE(write_safetensors(path, {{"b", b}}).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->names(), std::vector<std::string>{"b"});

  auto st = write_safetensors((dir / "no_such_dir" / "y.safetensors").string(), {{"b", b}});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("y.safetensors.tmp"), std::string::npos) << st;

  st = write_safetensors(path, {{"b", b}, {"b", b}});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("duplicate"), std::string::npos) << st;
  st = write_safetensors(path, {{"__metadata__", b}});
  EXPECT_FALSE(st.ok());
}

TEST(SafetensorsRead, UnalignedDataIsCopiedToAlignedBuffer) {
  // Header of 13 bytes of JSON padding to 8+N = odd offset: the f32 data is unaligned in the image.
  std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  if ((8 + header.size()) % 4 == 0) header += " ";
  std::string image = make_image(header, 0);
  const float vals[3] = {1.5f, -2.0f, 3.25f};
  image.append(reinterpret_cast<const char*>(vals), sizeof(vals));
  auto file = SafetensorsFile::from_bytes(image, "unaligned");
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->get("w");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % 4, 0u);
  EXPECT_EQ(t->data<float>()[0], 1.5f);
  EXPECT_EQ(t->data<float>()[1], -2.0f);
  EXPECT_EQ(t->data<float>()[2], 3.25f);
}

TEST(SafetensorsRead, EmptyTensorsAndGapsAreAccepted) {
  auto file = SafetensorsFile::from_bytes(
      make_image(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                 R"("z":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                 8),
      "empty");
  ASSERT_TRUE(file.ok()) << file.status();
  auto e = (*file)->get("e");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_EQ(e->shape(), Shape({0, 4}));
  auto z = (*file)->get("z");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->data<uint8_t>()[0], 4);
  EXPECT_EQ(z->data<uint8_t>()[1], 5);
  auto missing = (*file)->get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE((*file)->contains("nope"));
  EXPECT_EQ((*file)->find("nope"), nullptr);
}

// ----------------------------------------------------------------------------------------------
// Checkpoints

void write_shards(const fs::path& dir, std::vector<std::pair<std::string, Tensor>>& all) {
  std::mt19937_64 rng(99);
  all = {{"embed", random_tensor({6, 4}, DType::kBF16, rng)},
         {"layer.0.w", random_tensor({4, 4}, DType::kF32, rng)},
         {"layer.1.w", random_tensor({4, 4}, DType::kF32, rng)},
         {"head", random_tensor({4, 6}, DType::kF16, rng)}};
  ASSERT_TRUE(
      write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {all[0], all[1]})
          .ok());
  ASSERT_TRUE(
      write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {all[2], all[3]})
          .ok());
}

TEST(Checkpoint, ShardedWithIndexReadsBack) {
  const fs::path dir = scratch_dir();
  std::vector<std::pair<std::string, Tensor>> all;
  write_shards(dir, all);
  json index = {{"metadata", {{"total_size", 1234}}},
                {"weight_map",
                 {{"embed", "model-00001-of-00002.safetensors"},
                  {"layer.0.w", "model-00001-of-00002.safetensors"},
                  {"layer.1.w", "model-00002-of-00002.safetensors"},
                  {"head", "model-00002-of-00002.safetensors"}}}};
  write_file(dir / "model.safetensors.index.json", index.dump(2));

  auto ck = Checkpoint::open(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->dir(), dir.string());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"embed", "head", "layer.0.w", "layer.1.w"}));
  for (const auto& [name, t] : all) {
    ASSERT_TRUE(ck->contains(name));
    ASSERT_NE(ck->find(name), nullptr);
    auto got = ck->get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(same_bytes(*got, t)) << name;
  }
  EXPECT_EQ(ck->get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ck->find("nope"), nullptr);
}

TEST(Checkpoint, ShardsWithoutIndexAndSingleFile) {
  const fs::path dir = scratch_dir();
  std::vector<std::pair<std::string, Tensor>> all;
  write_shards(dir, all);
  auto ck = Checkpoint::open(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->names().size(), all.size());
  for (const auto& [name, t] : all) EXPECT_TRUE(same_bytes(*ck->get(name), t)) << name;

  // model.safetensors takes precedence over the other files.
  ASSERT_TRUE(write_safetensors((dir / "model.safetensors").string(), {all[0]}).ok());
  ck = Checkpoint::open(dir.string());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->names(), std::vector<std::string>{"embed"});
}

// ----------------------------------------------------------------------------------------------
// Malformed inputs

struct BadCase {
  const char* label;
  std::string bytes;
  const char* expect;  // substring of the message
};

TEST(SafetensorsMalformed, EveryCaseIsRejectedWithAMessage) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  auto one = [](const std::string& entry_body, size_t data = 8) {
    return make_image("{\"t\":" + entry_body + "}", data);
  };
  const std::vector<BadCase> cases = {
      {"empty file", "", "shorter than the 8-byte"},
      {"truncated length", std::string("\x10\x00\x00", 3), "shorter than the 8-byte"},
      {"huge header length", raw_length(uint64_t{1} << 40) + "{}", "exceeds the limit"},
      {"max header length", raw_length(~uint64_t{0}) + "{}", "exceeds the limit"},
      {"header past end", raw_length(100) + "{}", "truncated"},
      {"bad json", make_image("{\"t\": {", 0), "not valid JSON"},
      {"json garbage bytes", make_image(std::string("\xff\xfe\x00{}", 5), 0), "not valid JSON"},
      {"header not object", make_image("[1,2,3]", 0), "not a JSON object"},
      {"entry not object", make_image(R"({"t": 3})", 0), "entry is not a JSON object"},
      {"missing dtype", one(R"({"shape":[2],"data_offsets":[0,8]})"), "missing dtype"},
      {"dtype not string", one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"),
       "dtype is not a string"},
      {"wrong dtype", one(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"),
       "unsupported safetensors dtype 'F33'"},
      {"missing shape", one(R"({"dtype":"F32","data_offsets":[0,8]})"), "missing shape"},
      {"shape not array", one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"),
       "shape is not an array"},
      {"negative shape", one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
       "non-negative integers"},
      {"fractional shape", one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,8]})"),
       "non-negative integers"},
      {"too many dims", one(R"({"dtype":"F32","shape":[1,1,1,1,1,1,2],"data_offsets":[0,8]})"),
       "more than 6"},
      {"shape overflow",
       one(R"({"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]})"),
       "overflows"},
      {"missing offsets", one(R"({"dtype":"F32","shape":[2]})"), "missing data_offsets"},
      {"offsets wrong arity", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4,8]})"),
       "array of two integers"},
      {"negative offset", one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
       "non-negative integers"},
      {"offsets reversed", one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
       "begin 8 > end 0"},
      {"offsets out of range", one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})"),
       "out of range"},
      {"size mismatch", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
       "byte size mismatch"},
      {"overlap",
       make_image("{" + ok_entry + R"(,"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12),
       "overlaps tensor 't'"},
      {"metadata not object", make_image(R"({"__metadata__":[1]})", 0),
       "__metadata__ is not a JSON object"},
      {"metadata value not string", make_image(R"({"__metadata__":{"format":1}})", 0),
       "value of 'format' is not a string"},
      {"duplicate key", make_image("{" + ok_entry + "," + ok_entry + "}", 8),
       "duplicate JSON key 't'"},
  };
  ASSERT_GE(cases.size(), 15u);
  std::set<std::string> messages;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.label);
    auto file = SafetensorsFile::from_bytes(c.bytes, "case.safetensors");
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    const std::string msg(file.status().message());
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("case.safetensors"), std::string::npos) << msg;
    messages.insert(msg);
  }
  EXPECT_GE(messages.size(), 15u);
}

TEST(SafetensorsMalformed, TensorErrorsNameTheTensor) {
  auto file = SafetensorsFile::from_bytes(
      make_image(R"({"model.layers.3.w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
      "named.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("tensor 'model.layers.3.w'"), std::string::npos)
      << file.status();
}

TEST(SafetensorsMalformed, OpenErrors) {
  const fs::path dir = scratch_dir();
  auto missing = SafetensorsFile::open((dir / "missing.safetensors").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);

  auto is_dir = SafetensorsFile::open(dir.string());
  EXPECT_FALSE(is_dir.ok());

  // A valid file cut short: the data section no longer holds the tensor.
  std::mt19937_64 rng(3);
  const fs::path good = dir / "good.safetensors";
  ASSERT_TRUE(
      write_safetensors(good.string(), {{"w", random_tensor({64}, DType::kF32, rng)}}).ok());
  const std::string bytes = read_file(good);
  write_file(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 5));
  auto cut = SafetensorsFile::open((dir / "cut.safetensors").string());
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("out of range"), std::string::npos) << cut.status();
  write_file(dir / "tiny.safetensors", "abc");
  auto tiny = SafetensorsFile::open((dir / "tiny.safetensors").string());
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("shorter"), std::string::npos) << tiny.status();
}

// Writes an index.json with the given weight_map text next to two valid shards.
fs::path dir_with_index(const std::string& index_text) {
  const fs::path dir = scratch_dir();
  std::vector<std::pair<std::string, Tensor>> all;
  write_shards(dir, all);
  write_file(dir / "model.safetensors.index.json", index_text);
  return dir;
}

void expect_checkpoint_error(const fs::path& dir, const std::string& expect) {
  auto ck = Checkpoint::open(dir.string());
  ASSERT_FALSE(ck.ok()) << "expected: " << expect;
  EXPECT_NE(ck.status().message().find(expect), std::string::npos) << ck.status();
}

TEST(CheckpointMalformed, IndexErrors) {
  expect_checkpoint_error(
      dir_with_index(R"({"weight_map":{"embed":"model-00009-of-00009.safetensors"}})"),
      "shard 'model-00009-of-00009.safetensors'");
  expect_checkpoint_error(
      dir_with_index(R"({"weight_map":{"head":"model-00001-of-00002.safetensors"}})"),
      "tensor 'head' is listed in shard 'model-00001-of-00002.safetensors', which does not "
      "contain it");
  expect_checkpoint_error(dir_with_index(R"({"weight_map":[1]})"),
                          "weight_map is not a JSON object");
  expect_checkpoint_error(dir_with_index(R"({"weight_map":{"embed":3}})"),
                          "entry for 'embed' is not a string");
  expect_checkpoint_error(dir_with_index(R"({"metadata":{}})"), "missing weight_map");
  expect_checkpoint_error(dir_with_index(R"({"weight_map":)"), "not valid JSON");
  expect_checkpoint_error(dir_with_index(R"({"weight_map":{"embed":"../x.safetensors"}})"),
                          "not a relative path");
  expect_checkpoint_error(
      dir_with_index(R"({"weight_map":{"embed":"model-00001-of-00002.safetensors",)"
                     R"("embed":"model-00002-of-00002.safetensors"}})"),
      "duplicate JSON key 'embed'");
}

TEST(CheckpointMalformed, DuplicateTensorAcrossShards) {
  const fs::path dir = scratch_dir();
  std::mt19937_64 rng(5);
  Tensor t = random_tensor({4}, DType::kF32, rng);
  ASSERT_TRUE(write_safetensors((dir / "a.safetensors").string(), {{"w", t}}).ok());
  ASSERT_TRUE(write_safetensors((dir / "b.safetensors").string(), {{"w", t}, {"v", t}}).ok());
  expect_checkpoint_error(dir, "tensor 'w' appears in both");

  // Also when an index lists each name only once.
  write_file(dir / "model.safetensors.index.json",
             R"({"weight_map":{"w":"a.safetensors","v":"b.safetensors"}})");
  expect_checkpoint_error(dir, "tensor 'w' appears in both");
}

TEST(CheckpointMalformed, EmptyOrMissingDirectory) {
  const fs::path dir = scratch_dir();
  auto ck = Checkpoint::open(dir.string());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ck.status().message().find("no model.safetensors"), std::string::npos) << ck.status();
  auto none = Checkpoint::open((dir / "does_not_exist").string());
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not a directory"), std::string::npos) << none.status();
  // A bad shard's own error propagates.
  write_file(dir / "bad.safetensors", "12345678");
  expect_checkpoint_error(dir, "bad.safetensors");
}

}  // namespace
}  // namespace loom
