# loom-tokenize: stdin JSON lines -> ids (or ids -> text with --decode). Kept here rather than in
# engine/tools/CMakeLists.txt so the tokenizer is self-contained.
add_executable(loom-tokenize ${CMAKE_CURRENT_SOURCE_DIR}/../tools/loom_tokenize.cc)
target_link_libraries(loom-tokenize PRIVATE loom_tokenizer nlohmann_json::nlohmann_json
  absl::flags absl::flags_parse absl::flags_usage)
loom_target_options(loom-tokenize)
