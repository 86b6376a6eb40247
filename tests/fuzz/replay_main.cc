// Replays inputs through a libFuzzer target without libFuzzer, so the normal (g++) build runs every
// target's seed corpus and kept crash reproducers as ctests (tests/fuzz/CMakeLists.txt).
//
//   <target>_replay PATH...   each PATH a file or a directory (its regular files, recursively,
//                             in sorted order)
//
// Every input is copied into a heap buffer of exactly its size (so an over-read is as visible to a
// sanitizer as under libFuzzer) and passed to LLVMFuzzerTestOneInput, after LLVMFuzzerInitialize
// when the target defines one. A crash or abort in the target fails the run by itself; a missing
// path, an unreadable file, no input at all, or a return value other than 0 or -1 (libFuzzer's
// "reject this input") exits with status 1.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional in a target: weak, so it is null when the target does not define it.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

namespace fs = std::filesystem;

// The files named by `arg`, sorted; false (with a message) if it does not exist.
bool collect(const std::string& arg, std::vector<fs::path>* files) {
  std::error_code ec;
  const fs::file_status st = fs::status(arg, ec);
  if (ec || !fs::exists(st)) {
    std::fprintf(stderr, "replay: %s does not exist\n", arg.c_str());
    return false;
  }
  if (!fs::is_directory(st)) {
    files->push_back(arg);
    return true;
  }
  std::vector<fs::path> found;
  for (const auto& entry : fs::recursive_directory_iterator(arg, ec)) {
    if (entry.is_regular_file()) found.push_back(entry.path());
  }
  if (ec) {
    std::fprintf(stderr, "replay: cannot list %s: %s\n", arg.c_str(), ec.message().c_str());
    return false;
  }
  std::sort(found.begin(), found.end());
  files->insert(files->end(), found.begin(), found.end());
  return true;
}

bool read_file(const fs::path& path, std::vector<char>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH... (files or directories of inputs)\n", argv[0]);
    return 1;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    if (!collect(argv[i], &files)) return 1;
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no inputs in the given paths\n");
    return 1;
  }
  std::vector<char> bytes;
  for (const fs::path& path : files) {
    if (!read_file(path, &bytes)) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 1;
    }
    // Printed before the call, so a crash's output names the input that caused it.
    std::printf("replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    // An exact-size copy (nothing after the last byte); new[] of 0 bytes is still a valid pointer.
    const std::unique_ptr<uint8_t[]> input(new uint8_t[bytes.size()]);
    std::copy(bytes.begin(), bytes.end(), input.get());
    const int rc = LLVMFuzzerTestOneInput(input.get(), bytes.size());
    if (rc != 0 && rc != -1) {
      std::fprintf(stderr, "replay: %s: LLVMFuzzerTestOneInput returned %d\n", path.c_str(), rc);
      return 1;
    }
  }
  std::printf("replay: %zu inputs, all passed\n", files.size());
  return 0;
}
