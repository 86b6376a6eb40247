# loom_gtest(NAME LABEL SOURCE LIBS...): a GoogleTest executable built into <build>/tests with the
# project's warnings, linked to LIBS and gtest_main, its cases registered with ctest under LABEL.
include(GoogleTest)
function(loom_gtest name label source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  loom_target_options(${name})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${label})
endfunction()
