# loom-tokenize: stdin JSON lines -> ids (or ids -> text with --decode). Kept here rather than in
# engine/tools/CMakeLists.txt so the tokenizer is self-contained.
add_executable(loom-tokenize ${CMAKE_CURRENT_SOURCE_DIR}/../tools/loom_tokenize.cc)
target_link_libraries(loom-tokenize PRIVATE loom_tokenizer nlohmann_json::nlohmann_json
  absl::flags absl::flags_parse absl::flags_usage)
loom_target_options(loom-tokenize)
# Its check against the tokenizer fixtures (a TikToken folder, a tokenizer.json): label unit.
add_test(NAME loom_tokenize_test
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/tools/loom_tokenize_test.py
    $<TARGET_FILE:loom-tokenize> ${LOOM_FIXTURES_DIR})
set_tests_properties(loom_tokenize_test PROPERTIES LABELS unit TIMEOUT 120)
