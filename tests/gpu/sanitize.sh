#!/bin/bash
# compute-sanitizer over the kernel tests, one process per GoogleTest case so the slow tools finish
# and a failure names its test. Called by run.sh (LOOM_GPU_SANITIZE); usable alone after a build:
#   bash tests/gpu/sanitize.sh TOOL LOGDIR [BINARY ...]   (TOOL memcheck or racecheck)
# The model tests run the same kernels at fixture sizes and are left out for time, as are the timing
# and long-sequence cases (sizes only a benchmark needs) and the tests that abort on purpose (death
# tests re-run the binary, which under a sanitizer never finishes).
# racecheck checks Loom's kernels only (every one lives in namespace loom): cuBLASLt's kernels are
# not ours to fix, racecheck reports hazards in their TMA/wgmma pipelines, and its instrumentation
# of the block-scaled FP8 ones ends in "Internal Sanitizer Error ... hardware exception".
set -uo pipefail
tool=$1 logs=$2; shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(build-cuda/tests/cuda_kernels_test build-cuda/tests/*_cuda_test)
par=${LOOM_SANITIZE_PARALLEL:-6}
per_test_s=${LOOM_SANITIZE_TIMEOUT_S:-600}
mkdir -p "$logs/$tool"
export LOOM_SANITIZE_KERNELS=
if [ "$tool" = racecheck ]; then
  LOOM_SANITIZE_KERNELS='--kernel-name kns=loom'
fi
cases=()
for t in "${bins[@]}"; do
  case $t in *model_*) continue ;; esac
  [ -x "$t" ] || continue
  suite= mine=()
  while IFS= read -r line; do
    case $line in
      "Running main"*) ;;
      "  "*) name=${line#  }; name=${name%% *}
             case "$suite$name" in *Death*|*ChecksAbort*|*RejectBf16*|*Timing*|*Throughput*|*LongSequence*|*Benchmark*) continue ;; esac
             mine+=("$t $suite$name") ;;
      *.) suite=$line ;;
    esac
  done < <("$t" --gtest_list_tests 2>/dev/null)
  # racecheck does not finish some full-size tests; small twins run the same kernels instead
  # (AttentionCuda.RacecheckSmallSteps, CudaLoss.RacecheckSmall, GemmCuda.RacecheckBatchInvariance).
  # cuBLASLt's block-scaled FP8 GEMM does not launch under racecheck at all (an internal sanitizer
  # error, even with the kernel left out of the instrumentation): its tests are left to memcheck.
  if [ "$tool" = racecheck ]; then
    kept=(); for c in "${mine[@]}"; do
      case ${c#* } in
        AttentionCuda.GqaVarlen | AttentionCuda.MlaVarlen | AttentionCuda.MlaDecodeAwkward | \
          AttentionCuda.BatchInvariance | AttentionCuda.MlaWgmmaBatchInvariance | \
          CudaLoss.MatchesCpu | CudaLoss.BatchInvariantRows | GemmCuda.BatchInvariance | \
          GemmFp8Cuda.AutoMeets* | GemmFp8Cuda.BlockScaled* | GemmFp8Cuda.DequantBf16*) ;;
        *) kept+=("$c") ;;
      esac
    done; mine=("${kept[@]}")
  fi
  cases+=("${mine[@]}")
done
run_one() {  # run_one TOOL LOGDIR TIMEOUT "BINARY TEST"
  local tool=$1 logs=$2 per_test_s=$3 bin=${4% *} test=${4#* }
  local log="$logs/$tool/$(basename "$bin").$test.log" t0=$(date +%s)
  # LOOM_MLA_SYNC_HANDOFF=1: the wgmma MLA kernel's bar.sync handoff, which racecheck can follow
  # (with the default bar.arrive side it reports hazards that the PTX barrier orders).
  LOOM_MLA_SYNC_HANDOFF=1 timeout "$per_test_s" compute-sanitizer --tool "$tool" $LOOM_SANITIZE_KERNELS \
    --error-exitcode 9 "$bin" --gtest_filter="$test" --gtest_color=no >"$log" 2>&1
  local rc=$?
  # Appended as each test ends, so a run cut short still shows what finished.
  printf '%s %s %s rc=%d %ds %s\n' "$tool" "$(basename "$bin")" "$test" "$rc" \
    "$(( $(date +%s) - t0 ))" "$(grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | head -1)" \
    >> "$logs/$tool/results.txt"
}
export -f run_one
printf '%s\n' "${cases[@]}" | xargs -P "$par" -I{} bash -c \
  'run_one "$0" "$1" "$2" "{}"' "$tool" "$logs" "$per_test_s"
sort "$logs/$tool/results.txt" > "$logs/$tool/summary.txt"
bad=$(grep -v -E ' rc=0 ' "$logs/$tool/summary.txt" | wc -l)
echo "sanitize.sh: $tool over ${#cases[@]} tests: $(( ${#cases[@]} - bad )) clean, $bad not (rc 9 errors, 124 timeout):"
grep -v -E ' rc=0 ' "$logs/$tool/summary.txt"
[ "$bad" = 0 ]
