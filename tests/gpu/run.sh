#!/usr/bin/env bash
# Builds the `cuda` preset (build-cuda/), runs the GPU kernel tests and the CUDA benchmark, and
# prints a results table. Meant for a machine with an NVIDIA GPU, nvcc, CMake and ninja; needs no
# ../shared fixtures. Where Abseil, nlohmann-json, GoogleTest, OpenBLAS, pkg-config, PCRE2 or
# utf8proc development files are missing (the lent H200 machines), it uses the Debian bookworm
# packages unpacked from .device-deps/deps.tar.xz when that file exists, and gRPC's (libraries,
# protoc, Python grpcio) from .device-deps/grpc.tar.xz (both git-ignored through
# .git/info/exclude; bench/results/gpu-h200.md says how they are made). The model tests,
# conformance and end-to-end tests read the fixtures carried in .device-fixtures.
#
#   bash tests/gpu/run.sh            # build only the GPU test and benchmark targets (and deps)
#   LOOM_GPU_BUILD_ALL=1 bash ...    # build everything in the preset
#   LOOM_GPU_SANITIZE=1 bash ...     # also memcheck + racecheck on every kernel test (or =memcheck)
#   LOOM_GPU_SUITE=kda_chunked bash  # only the chunked KDA test, benchmark and peer
#   LOOM_GPU_NO_PEER=1 bash ...      # skip the flash-linear-attention peers (Triton compiles ~2 min)
#   LOOM_GPU_NO_BENCH=1 bash ...     # skip the CUDA benchmarks (tests, conformance, end to end only)
# When .peers/fla holds flash-linear-attention's source (git-ignored), its recurrent KDA decode and
# chunked KDA forward are timed after Loom's benchmarks at the same shapes
# (bench/peers/fla_kda_decode.py, bench/peers/fla_chunk_kda.py).
# Logs go to $OUT (if set) or build-cuda/gpu-logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
jobs=$(nproc)
extra=()

if [ -f .device-deps/deps.tar.xz ]; then
  dd=/tmp/loom-device-deps
  if [ ! -d "$dd/usr" ]; then
    mkdir -p "$dd" && tar -C "$dd" -xJf .device-deps/deps.tar.xz || exit 1
  fi
  # gRPC, protobuf and their compilers (and Debian's Python grpcio for the end-to-end client),
  # when carried: then loom-server serves gRPC on the GPU machine too.
  if [ -f .device-deps/grpc.tar.xz ] && [ ! -x "$dd/usr/bin/protoc" ]; then
    tar -C "$dd" -xJf .device-deps/grpc.tar.xz || exit 1
  fi
  lib=$dd/usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH=$dd/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PATH=$dd/usr/bin:$PATH
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$dd/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$dd
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  extra+=(-DLOOM_OPENBLAS_LIB="$lib/openblas-pthread/libopenblas.so"
          -DLOOM_CBLAS_INCLUDE="$dd/usr/include/x86_64-linux-gnu/openblas-pthread")
  if [ -x "$dd/usr/bin/protoc" ]; then
    # The carried protoc and plugin, not any on the PATH: generated code must match the headers.
    extra+=(-DLOOM_PROTOC="$dd/usr/bin/protoc" -DLOOM_GRPC_CPP_PLUGIN="$dd/usr/bin/grpc_cpp_plugin")
  fi
  echo "run.sh: using carried packages from .device-deps ($dd)"
fi

logs=${OUT:-$root/build-cuda/gpu-logs}
mkdir -p "$logs"
echo "== $(date -u +%FT%TZ)  commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
nvcc --version 2>/dev/null | tail -1 || /usr/local/cuda/bin/nvcc --version | tail -1
cmake --version | head -1

t0=$(date +%s)
# LOOM_BENCH=OFF: the CPU Google Benchmark binary is not needed here (the CUDA benchmark below
# uses CUDA events and no Google Benchmark).
# LOOM_SERVER=ON: the server (HTTP, and gRPC where gRPC is found or carried) for the end-to-end
# tests against a GPU-backed server below.
if ! cmake --preset cuda -DLOOM_BENCH=OFF -DLOOM_SERVER=ON "${extra[@]}" >"$logs/configure.log" 2>&1; then
  tail -40 "$logs/configure.log"; echo "run.sh: configure FAILED"; exit 1
fi
suite=${LOOM_GPU_SUITE:-all}
targets=(--target gpu_tests kda_chunked_bench loom-conformance loom-server loom-bench-engine
         loom-bench)
# The gRPC client's Python stubs (build-cuda/python), where the server has gRPC.
if cmake --build build-cuda --target help 2>/dev/null | grep -qE '^loom_python_client(:| )'; then
  targets+=(loom_python_client)
fi
[ "$suite" = kda_chunked ] && targets=(--target kda_chunked_cuda_test kda_chunked_bench)
[ "${LOOM_GPU_BUILD_ALL:-0}" = 1 ] && targets=()
if ! cmake --build build-cuda -j "$jobs" "${targets[@]}" >"$logs/build.log" 2>&1; then
  grep -E "error|Error" "$logs/build.log" | head -40; echo "run.sh: build FAILED"; exit 1
fi
grep -iE "warning" "$logs/build.log" | head -20
echo "run.sh: configure + build $(( $(date +%s) - t0 )) s"

t1=$(date +%s)
test_rc=0
: >"$logs/test.log"
if [ "$suite" = all ]; then
  # Every GPU test binary (tests/gpu/*_cuda_test.cc and cuda_kernels_test), then the CPU-only
  # tolerance checks: the bounds exceed what a dropped element or a wrong scale gives (TOLCHECK).
  for t in build-cuda/tests/cuda_kernels_test build-cuda/tests/*_cuda_test \
           build-cuda/tests/cuda_tolerances_test; do
    [ -x "$t" ] || continue
    echo "== $t" >>"$logs/test.log"
    "$t" --gtest_color=no >>"$logs/test.log" 2>&1 || { test_rc=1; echo "run.sh: $t FAILED"; }
  done
else
  build-cuda/tests/kda_chunked_cuda_test --gtest_color=no >>"$logs/test.log" 2>&1 || test_rc=1
fi
echo "run.sh: tests exit $test_rc in $(( $(date +%s) - t1 )) s"

# loom-conformance --device cuda on every carried fixture (f32 activations; bf16 checkpoints
# widened to f32 weights, so the f32 bounds of fixtures/README.md apply), unbatched and batched.
# The fixtures travel in .device-fixtures (git-ignored; tests/gpu/README in bench/results/gpu-h200.md
# says how it is made); model_cuda_test reads them too.
: >"$logs/conformance.log"
if [ "$suite" = all ] && [ -d .device-fixtures ]; then
  t1=$(date +%s)
  # conform FIXTURE SUFFIX ARGS...: unbatched and batched, one line each in conformance.log.
  conform() {
    local f=$1 suffix=$2 mode r
    shift 2
    for mode in "" --batch; do
      if build-cuda/bin/loom-conformance --fixture "$f" --device cuda "$@" $mode \
          >"$logs/conf.out" 2>&1; then r=PASS; else r=FAIL; test_rc=1; fi
      echo "CONFORMANCE $(basename "$f")${mode:+_batch}$suffix $r $(tail -1 "$logs/conf.out" | grep -oE '"worst_[a-z_0-9]+":[0-9.e+-]+' | tr '\n' ' ')" \
        >>"$logs/conformance.log"
      cat "$logs/conf.out" >>"$logs/conformance.full.log"
    done
  }
  # (chat_templates/ is not a model: grpc_server_test.py's chat test reads its qwen3_next.)
  for f in .device-fixtures/*/; do
    [ -f "$f/config.json" ] && conform "${f%/}" "" --weight_dtype f32
  done
  # The bf16 path (bf16 weight matrices, GEMM inputs rounded to bf16) on the fixtures that record
  # the reference's own bf16 error: held to the bounds fixtures/README.md derives from it.
  for f in .device-fixtures/*_b0 .device-fixtures/*_fp8; do
    [ -d "$f" ] && conform "$f" _bf16 --dtype bf16
  done
  echo "run.sh: loom-conformance --device cuda in $(( $(date +%s) - t1 )) s"
fi
# The HTTP end-to-end test (tests/integration/http_server_test.py) against loom-server --device
# cuda on a carried fixture. It runs several servers at once: each gets a fixed cache budget, since
# a derived one (the default) takes --gpu_memory_utilization of the device for one server.
if [ "$suite" = all ] && [ -x build-cuda/bin/loom-server ] && [ -d .device-fixtures/kimi_linear_s1 ]; then
  t1=$(date +%s)
  if LOOM_SERVER_ARGS="--device cuda --cache_budget_mb 1024" timeout 600 python3 tests/integration/http_server_test.py \
      --server build-cuda/bin/loom-server --model .device-fixtures/kimi_linear_s1 \
      >"$logs/http_e2e.log" 2>&1; then r=PASS; else r=FAIL; test_rc=1; fi
  echo "run.sh: http_server_test.py against loom-server --device cuda: $r in $(( $(date +%s) - t1 )) s"
  tail -3 "$logs/http_e2e.log"
  t1=$(date +%s)
  # bf16 KV pages with --deterministic: rounding each cached value to bf16 turns the default
  # path's last-bit differences between batch compositions into visible ones (a seeded sample
  # then differs between a solo and a loaded run, which this test checks), so it runs in
  # batch-invariant mode, where the bits do not depend on the batch at all.
  if LOOM_SERVER_ARGS="--device cuda --cache_budget_mb 1024 --kv_dtype bf16 --deterministic" timeout 600 python3 \
      tests/integration/http_server_test.py --server build-cuda/bin/loom-server \
      --model .device-fixtures/kimi_linear_s1 >"$logs/http_e2e_bf16kv.log" 2>&1; then r=PASS
  else r=FAIL; test_rc=1; fi
  echo "run.sh: the same with --kv_dtype bf16 --deterministic: $r in $(( $(date +%s) - t1 )) s"
  tail -3 "$logs/http_e2e_bf16kv.log"
  # gRPC (tests/integration/grpc_server_test.py, the Python client) when the server has it.
  # The client needs Python's grpcio: the machine's python3, else the carried Debian Python 3.11
  # with Debian's grpcio (Debian builds grpcio for its own Python only).
  grpc_py=
  if python3 -c "import grpc, google.protobuf" 2>/dev/null; then
    grpc_py=python3
  elif [ -x "${dd:-/nonexistent}/usr/bin/python3.11" ] &&
       "$dd/usr/bin/python3.11" -c "import grpc, google.protobuf" 2>/dev/null; then
    grpc_py=$dd/usr/bin/python3.11
  fi
  if [ -d build-cuda/python ] && [ -n "$grpc_py" ]; then
    t1=$(date +%s)
    if timeout 600 "$grpc_py" tests/integration/grpc_server_test.py --server build-cuda/bin/loom-server \
        --model .device-fixtures/kimi_linear_s1 --pythonpath build-cuda/python \
        --extra-args "--port 0 --max_n 3 --device cuda" --max-n 3 >"$logs/grpc_e2e.log" 2>&1
    then r=PASS; else r=FAIL; test_rc=1; fi
    echo "run.sh: grpc_server_test.py against loom-server --device cuda: $r in $(( $(date +%s) - t1 )) s"
    tail -3 "$logs/grpc_e2e.log"
  else
    echo "run.sh: no gRPC end-to-end test (server built without gRPC, or no Python with grpcio)"
  fi
fi
grep -E "^\[  FAILED|LOOM_CHECK|CUDA call|Failure" "$logs/test.log" | head -20

t2=$(date +%s)
bench_rc=0
: >"$logs/bench.log"
if [ "$suite" = all ] && [ "${LOOM_GPU_NO_BENCH:-0}" != 1 ]; then
  for b in build-cuda/bin/*_cuda_bench; do
    [ -x "$b" ] || continue
    "$b" >>"$logs/bench.log" 2>&1 || { bench_rc=1; echo "run.sh: $b FAILED"; }
  done
fi
if [ "${LOOM_GPU_NO_BENCH:-0}" != 1 ]; then
  build-cuda/bin/kda_chunked_bench >>"$logs/bench.log" 2>&1 || bench_rc=1
fi
# The serving engine on the GPU (a carried fixture: a tiny model, so this measures the engine's
# per-step floor, not the kernels), default and batch-invariant numerics.
if [ "$suite" = all ] && [ -x build-cuda/bin/loom-bench-engine ] && [ -d .device-fixtures/kimi_linear_s1 ]; then
  for det in false true; do
    echo "ENGINEBENCH deterministic=$det" >>"$logs/engine_bench.log"
    build-cuda/bin/loom-bench-engine --device cuda --model .device-fixtures/kimi_linear_s1 \
      --deterministic=$det --concurrency 1,8,64 --ttft_prompt_len 4000 \
      >>"$logs/engine_bench.log" 2>&1 || bench_rc=1
  done
fi
echo "run.sh: benchmark exit $bench_rc in $(( $(date +%s) - t2 )) s"

# Peers: flash-linear-attention's recurrent KDA decode and chunked KDA forward at the shapes of
# Loom's rows, in the same run (its source, git-ignored, in .peers/fla; see bench/peers/).
peer_rc=0
if [ -d .peers/fla/fla ] && [ "${LOOM_GPU_NO_PEER:-0}" != 1 ]; then
  t3=$(date +%s)
  export PYTHONUNBUFFERED=1 PYTHONPATH=$root/.peers/fla${PYTHONPATH:+:$PYTHONPATH}
  if [ "$suite" = all ]; then
    python3 bench/peers/fla_kda_decode.py >"$logs/fla.log" 2>&1 || peer_rc=1
  fi
  python3 bench/peers/fla_chunk_kda.py >"$logs/fla_chunk.log" 2>&1 || peer_rc=1
  echo "run.sh: flash-linear-attention peers exit $peer_rc in $(( $(date +%s) - t3 )) s"
  [ $peer_rc = 0 ] || tail -15 "$logs"/fla*.log
fi

# compute-sanitizer over every kernel test, one process per test case (tests/gpu/sanitize.sh says
# what is left out and why): LOOM_GPU_SANITIZE=1 runs memcheck (out-of-bounds and misaligned
# accesses, leaks) and racecheck (shared-memory hazards), =memcheck or =racecheck one.
sanitize=${LOOM_GPU_SANITIZE:-0}
if [ "$sanitize" != 0 ] && command -v compute-sanitizer >/dev/null; then
  case $sanitize in
    memcheck | racecheck) tools=("$sanitize") ;;
    *) tools=(memcheck racecheck) ;;
  esac
  for tool in "${tools[@]}"; do
    bash tests/gpu/sanitize.sh "$tool" "$logs"
    echo "run.sh: $tool exit $?"
  done
fi

echo
echo "== CUDA kernels vs CPU twins (scaled max error unless noted in tests/gpu/cuda_kernels_test.cc)"
printf '| %-46s | %10s | %10s | %-4s |\n' kernel "max error" tolerance pass
printf '|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------" "------------" "------"
grep '^GPUCHECK' "$logs/test.log" | awk '{printf "| %-46s | %10s | %10s | %-4s |\n", $2, $3, $4, $5}'
echo "checks: $(grep -c '^GPUCHECK.*PASS' "$logs/test.log") pass, $(grep -c '^GPUCHECK.*FAIL' "$logs/test.log") fail; gtest: $(grep -E '^\[  (PASSED|FAILED)' "$logs/test.log" | tr '\n' ' ')"
if [ -s "$logs/engine_bench.log" ]; then
  echo
  echo "== loom-bench-engine --device cuda, kimi_linear_s1 (tiny: the per-step floor)"
  cat "$logs/engine_bench.log"
fi
if [ -s "$logs/conformance.log" ]; then
  echo
  echo "== loom-conformance --device cuda --weight_dtype f32 (fixtures/README.md bounds)"
  cat "$logs/conformance.log"
fi
echo
echo "== Tolerances bite: broken CPU results (a dropped element, a wrong scale) against each bound"
printf '| %-46s | %10s | %10s |\n' "broken result" error tolerance
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "------------" "------------"
grep '^TOLCHECK' "$logs/test.log" | awk '{printf "| %-46s | %10s | %10s |\n", $2, $3, $4}'
echo
echo "== Benchmarks ($(grep '^device:' "$logs/bench.log"))"
printf '| %-48s | %12s | %16s | %8s | %9s |\n' benchmark achieved roofline fraction "median ms"
printf '|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..50})" "--------------" "------------------" "----------" "-----------"
grep '^GPUBENCH' "$logs/bench.log" | awk '{printf "| %-48s | %7s %-4s | %9s %-6s | %7.1f%% | %9s |\n", $2, $3, ($4=="TFLOP/s"?"TF/s":$4), $5, ($4=="TFLOP/s"?"TF/s":$4), 100*$6, $7}'
[ $bench_rc = 0 ] || tail -5 "$logs/bench.log"
if grep -q '^KDADECODE' "$logs/bench.log"; then
  echo
  echo "== Batched KDA decode (state bytes read + written; copy = this run's d2d copy)"
  printf '| %-48s | %9s | %10s | %9s | %9s |\n' benchmark "us" "GB/s" "of copy" "of 4.8TB/s"
  printf '|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..50})" "-----------" "------------" "-----------" "-----------"
  grep '^KDADECODE' "$logs/bench.log" | awk '{printf "| %-48s | %9s | %10s | %9s | %9s |\n", $2, $3, $5, $7, $10}'
fi
if grep -q '^KDACHUNK' "$logs/bench.log"; then
  echo
  echo "== Chunked KDA forward, Loom vs flash-linear-attention chunk_kda ($(head -1 "$logs/fla_chunk.log" 2>/dev/null))"
  grep '^FLACHECK' "$logs/fla_chunk.log" 2>/dev/null
  printf '| %-36s | %9s | %9s | %9s | %9s | %9s | %8s | %8s |\n' shape "Loom ms" "prep ms" \
    "state ms" "fla ms" "fla/Loom" "TF/s" "GB/s"
  printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..38})" "-----------" "-----------" \
    "-----------" "-----------" "-----------" "----------" "----------"
  grep '^KDACHUNK' "$logs/bench.log" | while read -r _ name ms tf gb prep state; do
    fla=$(grep "^FLACHUNK $name " "$logs/fla_chunk.log" 2>/dev/null | awk '{print $3}')
    ratio=$( [ -n "$fla" ] && awk -v a="$fla" -v b="$ms" 'BEGIN{printf "%.2fx", a/b}' || echo -)
    printf '| %-36s | %9s | %9s | %9s | %9s | %9s | %8s | %8s |\n' "$name" "$ms" "$prep" "$state" \
      "${fla:--}" "$ratio" "$tf" "$gb"
  done
fi
if [ -f "$logs/fla.log" ]; then
  echo
  echo "== flash-linear-attention fused_recurrent_kda_fwd, same shapes ($(head -1 "$logs/fla.log"))"
  grep '^FLACHECK' "$logs/fla.log"
  grep '^FLABENCH' "$logs/fla.log" | awk '{printf "| %-48s | %9s us | %10s GB/s |\n", $2, $3, $5}'
fi
[ $test_rc = 0 ] && [ $bench_rc = 0 ] && [ $peer_rc = 0 ]
