# Loom: the commands a new user needs. `make test` and `make run` do all set-up themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

FIXTURES ?= ../shared/fixtures
RUN_FIXTURE ?= $(FIXTURES)/kimi_linear_s1
JOBS ?= $(shell nproc)

# Debian packages the build needs (see docs/dependencies.md for why each is here).
DEB_PACKAGES := cmake ninja-build g++ pkg-config libabsl-dev nlohmann-json3-dev libopenblas-openmp-dev \
  libpcre2-dev libutf8proc-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libboost-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
  python3-grpcio python3-protobuf python3-yaml yamllint curl gnuplot-nox
# Node.js and npm (for the openai SDK integration test) come with this machine kind, not from
# Debian: the Debian npm package conflicts with them. `openai-sdk` (part of `make test`) installs
# the pinned SDK into build/npm-openai when node and npm exist; the test then runs offline, FAILS
# when node exists but the SDK is missing, and skips (loudly) only without node.
# Extra packages for `make lint` and `make fuzz` (clang, its sanitizer runtime, the linters).
DEV_PACKAGES := clang clang-format clang-tidy libclang-rt-14-dev

.PHONY: help deps dev-deps configure build openai-sdk test run conformance lint format asan fuzz cuda-build bench bench-serve clean default-model

help:
	@echo "make test   install missing packages, build, run every test (ctest)"
	@echo "make run    install, build, serve the bundled default model (loom-server, http://127.0.0.1:8000)"
	@echo "make conformance  loom-conformance on $(RUN_FIXTURE)"
	@echo "make build  install and build; binaries land in build/bin/"
	@echo "make lint   clang-format check and clang-tidy"
	@echo "make asan   build and test with address + undefined sanitizers (build-asan/)"
	@echo "make fuzz   build the libFuzzer targets and run each for FUZZ_SECONDS (60)"
	@echo "make bench  CPU kernel benchmarks (Google Benchmark)"
	@echo "make bench-serve  loom-bench serve against the default model (bench/results/serve-cpu.*)"
	@echo "make cuda-build  compile the CUDA preset (needs nvcc; does not run GPU code)"

# Installs only what is missing; silent when everything is present.
define apt_install
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

deps:
	$(call apt_install,$(DEB_PACKAGES))

dev-deps: deps
	$(call apt_install,$(DEV_PACKAGES))

configure: deps
	@cmake --preset cpu -DLOOM_FIXTURES_DIR=$(abspath $(FIXTURES)) >/dev/null

build: configure
	@cmake --build build -j $(JOBS)

# The pinned openai npm SDK for the openai_sdk_e2e test (version in run_openai_sdk_test.py).
# A failed install only warns here: the test itself then fails and says why.
openai-sdk: configure
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  /usr/bin/python3 tests/integration/run_openai_sdk_test.py --install-only --prefix build/npm-openai >/dev/null || \
	    echo "warning: could not install the openai npm SDK into build/npm-openai: openai_sdk_e2e will fail"; \
	  /usr/bin/python3 tests/integration/run_grpc_js_test.py --install-only --prefix build/npm-grpc >/dev/null || \
	    echo "warning: could not install @grpc/grpc-js into build/npm-grpc: grpc_js_e2e will fail"; \
	else echo "warning: node/npm not installed: openai_sdk_e2e and grpc_js_e2e will be skipped"; fi

# ctest runs JOBS test processes at once, each with an OpenMP pool as wide as the machine: passive
# waiting keeps the oversubscribed pools from spinning against each other (3-5x slower otherwise).
test: build openai-sdk
	OMP_WAIT_POLICY=PASSIVE ctest --test-dir build --output-on-failure -j $(JOBS)

# The main job: loom-server on the bundled (untrained) default model, in the foreground.
run: build default-model
	./build/bin/loom-server --model build/default-model $(SERVER_FLAGS)

# The conformance report of one fixture (what `make run` did before the server existed).
conformance: build
	./build/bin/loom-conformance --fixture $(RUN_FIXTURE)

# The bundled default model: the trained weights in weights/default (weights/default/README.md),
# copied where `make run` and the images serve them from (an earlier build's UNTRAINED marker
# goes).
build/default-model/model.safetensors: weights/default/config.json weights/default/model.safetensors
	@mkdir -p build/default-model && rm -f build/default-model/UNTRAINED
	cp weights/default/config.json weights/default/model.safetensors build/default-model/

default-model: build/default-model/model.safetensors

bench: build
	./build/bin/loom-bench-kernels --benchmark_counters_tabular=true

# `loom-bench serve` against loom-server on the bundled default model: the table on stdout, and
# the JSON, a markdown section and the PNG under bench/results/ (SERVE_BENCH_OUT names them).
SERVE_BENCH_OUT ?= bench/results/serve-cpu
SERVE_BENCH_FLAGS ?= --concurrency 1,2,4,8,16,32 --input_len 128 --output_len 64
bench-serve: build default-model
	bench/serve/run_against_model.sh build build/default-model $(SERVE_BENCH_FLAGS) \
	  --json $(SERVE_BENCH_OUT).json --markdown $(SERVE_BENCH_OUT).md --plot $(SERVE_BENCH_OUT).png

LINT_SOURCES = $(shell git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
lint: dev-deps configure
	clang-format --dry-run -Werror $(LINT_SOURCES)
	clang-tidy -p build --quiet $(filter %.cc,$(LINT_SOURCES)) 2>/dev/null

format: dev-deps
	clang-format -i $(LINT_SOURCES)

asan: deps
	@cmake --preset asan -DLOOM_FIXTURES_DIR=$(abspath $(FIXTURES)) >/dev/null
	cmake --build build-asan -j $(JOBS)
	OMP_WAIT_POLICY=PASSIVE ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= safetensors_fuzz config_fuzz tokenizer_fuzz tool_call_fuzz openai_request_fuzz \
  responses_request_fuzz sse_stream_fuzz chat_template_fuzz
# Each target <name>_fuzz runs on a copy of tests/fuzz/corpus/<name>/ with
# tests/fuzz/corpus/<name>.dict when present; any crash or sanitizer report fails the target.
fuzz: dev-deps
	@cmake --preset fuzz >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	@set -o pipefail; for t in $(FUZZ_TARGETS); do \
	  name=$${t%_fuzz}; corpus=build-fuzz/corpus/$$name; mkdir -p $$corpus; \
	  if [ -d tests/fuzz/corpus/$$name ]; then cp -n tests/fuzz/corpus/$$name/* $$corpus/ 2>/dev/null || true; fi; \
	  dict=""; [ -f tests/fuzz/corpus/$$name.dict ] && dict="-dict=tests/fuzz/corpus/$$name.dict"; \
	  echo "== $$t for $(FUZZ_SECONDS)s"; \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./build-fuzz/bin/$$t -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=4096 $$dict -artifact_prefix=build-fuzz/ -print_final_stats=1 $$corpus 2>&1 | tail -n 15 || exit 1; \
	done

# Compiles (does not run) the CUDA preset: engine, kernels and tests, no server.
cuda-build: deps
	@command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "nvcc not found"; exit 1; }
	@cmake --preset cuda -DLOOM_FIXTURES_DIR=$(abspath $(FIXTURES)) >/dev/null
	cmake --build build-cuda -j $(JOBS)

clean:
	rm -rf build build-asan build-fuzz build-cuda
