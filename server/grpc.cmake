# The gRPC frontend (included by server/CMakeLists.txt when present). Defines loom_server_grpc only
# when proto/ found gRPC (target loom_proto); loom-server then links it with LOOM_WITH_GRPC.
if(NOT TARGET loom_proto OR TARGET loom_server_grpc)
  return()
endif()
include(GoogleTest)
find_package(gRPC CONFIG REQUIRED)  # imported targets are directory-scoped: find again here

add_library(loom_server_grpc ${CMAKE_SOURCE_DIR}/server/grpc_server.cc
  ${CMAKE_SOURCE_DIR}/server/grpc_convert.cc)
# Metrics, AdmissionGate and StreamPump (server/metrics.*, admission.*, stream_pump.*) live in the
# HTTP frontend's library; without it (built from proto/ before server/CMakeLists.txt existed) the
# gRPC library compiles them in itself.
if(TARGET loom_server_http)
  target_link_libraries(loom_server_grpc PUBLIC loom_server_http)
else()
  target_sources(loom_server_grpc PRIVATE ${CMAKE_SOURCE_DIR}/server/metrics.cc
    ${CMAKE_SOURCE_DIR}/server/admission.cc ${CMAKE_SOURCE_DIR}/server/stream_pump.cc)
endif()
target_include_directories(loom_server_grpc PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(loom_server_grpc PUBLIC loom_proto loom_engine gRPC::grpc++
  gRPC::grpc++_reflection absl::status absl::statusor absl::strings absl::synchronization
  absl::time)
loom_target_options(loom_server_grpc)

# loom-grpc-harness: an Engine and a GrpcServer alone (no HTTP), for the integration tests and
# for trying the API with grpcurl. Prints "loom-server: grpc listening on HOST:PORT".
add_executable(loom-grpc-harness ${CMAKE_SOURCE_DIR}/server/grpc_harness_main.cc)
target_link_libraries(loom-grpc-harness PRIVATE loom_server_grpc loom_engine absl::flags
  absl::flags_parse)
loom_target_options(loom-grpc-harness)

# Unit test of request validation and conversion (no server).
add_executable(grpc_convert_test ${CMAKE_SOURCE_DIR}/server/grpc_convert_test.cc)
target_link_libraries(grpc_convert_test PRIVATE loom_server_grpc GTest::gtest GTest::gtest_main)
target_compile_definitions(grpc_convert_test PRIVATE LOOM_FIXTURES_DIR="${LOOM_FIXTURES_DIR}")
set_target_properties(grpc_convert_test PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
loom_target_options(grpc_convert_test)
gtest_discover_tests(grpc_convert_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit)

# GrpcServer on a real Engine through the C++ stub (validation, streaming, cancel, drain).
add_executable(grpc_server_test ${CMAKE_SOURCE_DIR}/server/grpc_server_test.cc)
target_link_libraries(grpc_server_test PRIVATE loom_server_grpc GTest::gtest GTest::gtest_main)
target_compile_definitions(grpc_server_test PRIVATE LOOM_FIXTURES_DIR="${LOOM_FIXTURES_DIR}")
set_target_properties(grpc_server_test PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
loom_target_options(grpc_server_test)
gtest_discover_tests(grpc_server_test DISCOVERY_TIMEOUT 60 PROPERTIES LABELS integration TIMEOUT 120)

# The integration tests, registered here too so they exist whatever includes them first.
include(${CMAKE_SOURCE_DIR}/tests/integration/grpc.cmake)
