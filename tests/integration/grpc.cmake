# gRPC frontend tests (ctest label `integration`): the Python client (clients/python) against a
# real server on a loopback port. Included by tests/integration/CMakeLists.txt and, as a fallback,
# by server/grpc.cmake; each test is registered once. Needs /usr/bin/python3 with Debian's
# python3-grpcio and python3-protobuf (not a pyenv python without grpc).
if(NOT TARGET loom_server_grpc)
  return()
endif()
set(LOOM_GRPC_TEST_MODEL ${LOOM_FIXTURES_DIR}/kimi_linear_s1)
set(LOOM_GRPC_TEST_SCRIPT ${CMAKE_SOURCE_DIR}/tests/integration/grpc_server_test.py)

# Against loom-grpc-harness: an Engine and the GrpcServer alone.
get_property(done GLOBAL PROPERTY LOOM_GRPC_HARNESS_TEST)
if(NOT done)
  set_property(GLOBAL PROPERTY LOOM_GRPC_HARNESS_TEST TRUE)
  add_test(NAME grpc_harness_e2e
    COMMAND /usr/bin/python3 ${LOOM_GRPC_TEST_SCRIPT} --server $<TARGET_FILE:loom-grpc-harness>
            --model ${LOOM_GRPC_TEST_MODEL} --pythonpath ${LOOM_PROTO_PY_DIR})
  set_tests_properties(grpc_harness_e2e PROPERTIES LABELS integration TIMEOUT 300)
endif()

# Against loom-server itself (HTTP and gRPC together). server/CMakeLists.txt includes this file
# before it defines loom-server, so its presence is what says the target will exist.
get_property(done GLOBAL PROPERTY LOOM_GRPC_SERVER_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_GRPC_SERVER_TEST TRUE)
  add_test(NAME grpc_server_e2e
    COMMAND /usr/bin/python3 ${LOOM_GRPC_TEST_SCRIPT} --server $<TARGET_FILE:loom-server>
            --model ${LOOM_GRPC_TEST_MODEL} --pythonpath ${LOOM_PROTO_PY_DIR}
            --extra-args "--port 0 --max_n 3" --max-n 3)
  set_tests_properties(grpc_server_e2e PROPERTIES LABELS integration TIMEOUT 300)
endif()

# The rules both frontends of loom-server obey alike (API key, admission, sampling validation,
# drain), checked over HTTP and gRPC against one loom-server.
get_property(done GLOBAL PROPERTY LOOM_FRONTEND_RULES_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_FRONTEND_RULES_TEST TRUE)
  add_test(NAME frontend_rules_e2e
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/integration/frontend_rules_test.py
            --server $<TARGET_FILE:loom-server> --model ${LOOM_GRPC_TEST_MODEL}
            --pythonpath ${LOOM_PROTO_PY_DIR})
  set_tests_properties(frontend_rules_e2e PROPERTIES LABELS integration TIMEOUT 300)
endif()

# --deterministic end to end: a seeded request's tokens and logprobs are the same alone and under
# load, over HTTP and gRPC (tests/integration/deterministic_test.py).
get_property(done GLOBAL PROPERTY LOOM_DETERMINISTIC_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_DETERMINISTIC_TEST TRUE)
  add_test(NAME deterministic_e2e
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/integration/deterministic_test.py
            --server $<TARGET_FILE:loom-server> --model ${LOOM_GRPC_TEST_MODEL}
            --pythonpath ${LOOM_PROTO_PY_DIR})
  set_tests_properties(deterministic_e2e PROPERTIES LABELS integration TIMEOUT 300)
endif()

# loom-server --expert_parallel 2 and 3 (thread ranks): every request over HTTP and gRPC, and a
# session's turns on each, equal the one-rank server's under --deterministic; per-rank metrics;
# bad rank counts refused (tests/integration/expert_parallel_server_test.py).
get_property(done GLOBAL PROPERTY LOOM_EXPERT_PARALLEL_SERVER_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_EXPERT_PARALLEL_SERVER_TEST TRUE)
  add_test(NAME expert_parallel_server_e2e
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/integration/expert_parallel_server_test.py
            --server $<TARGET_FILE:loom-server> --model ${LOOM_GRPC_TEST_MODEL}
            --pythonpath ${LOOM_PROTO_PY_DIR})
  set_tests_properties(expert_parallel_server_e2e PROPERTIES LABELS "integration;expert_parallel"
                       TIMEOUT 300)
endif()

# gRPC Chat sessions (session_id, store, DeleteSession) on loom-server --deterministic: continued
# turns equal the whole history (over gRPC and HTTP chat), NOT_FOUND, validation, tool turns.
get_property(done GLOBAL PROPERTY LOOM_GRPC_SESSIONS_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_GRPC_SESSIONS_TEST TRUE)
  add_test(NAME grpc_sessions_e2e
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/integration/grpc_sessions_test.py
            --server $<TARGET_FILE:loom-server> --model ${LOOM_GRPC_TEST_MODEL}
            --pythonpath ${LOOM_PROTO_PY_DIR})
  set_tests_properties(grpc_sessions_e2e PROPERTIES LABELS integration TIMEOUT 300)
endif()

# Node's @grpc/grpc-js (+ @grpc/proto-loader on proto/loom/v1/loom.proto), installed into the
# build dir by `make test` (pinned; never committed): Chat with tools equals HTTP's chat, a session
# equals the whole history, DeleteSession. Fails when node exists and the packages cannot be had;
# exit 77 (skipped) only without node.
get_property(done GLOBAL PROPERTY LOOM_GRPC_JS_TEST)
if((TARGET loom-server OR EXISTS ${CMAKE_SOURCE_DIR}/server/CMakeLists.txt) AND NOT done)
  set_property(GLOBAL PROPERTY LOOM_GRPC_JS_TEST TRUE)
  add_test(NAME grpc_js_e2e
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/integration/run_grpc_js_test.py
            --server $<TARGET_FILE:loom-server> --model ${LOOM_GRPC_TEST_MODEL}
            --prefix ${CMAKE_BINARY_DIR}/npm-grpc --proto-dir ${CMAKE_SOURCE_DIR}/proto
            --script ${CMAKE_SOURCE_DIR}/tests/integration/grpc_js_test.mjs)
  set_tests_properties(grpc_js_e2e PROPERTIES LABELS integration TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
