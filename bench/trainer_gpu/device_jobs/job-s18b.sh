# Session 18, call B: MLA's two projections as cuBLAS GEMMs per head for prefill-sized calls
# (kernels/cuda/attention.cc; the ncu profile of s18a: Loom's projection kernels took 55 of an
# 8192-token prefill's ~260 ms). attention_cuda_test's MLA cases against the CPU (N = 277: the GEMM
# path, and the kernels in invariant mode), model_cuda_test (whole models against the CPU),
# model_step_clock_cuda_test (its corrected expectations), then loom-bench offline's prefill on the
# 48B-shaped model with the GEMMs and with LOOM_MLA_PROJECTION_KERNELS=1 (the kernels), one binary.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s18b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s18b} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
loom_configure || exit 1
loom_build attention_cuda_test model_cuda_test model_step_clock_cuda_test loom-bench || exit 1
S=$OUT/summary.txt; : > $S
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 90 build-cuda/tests/attention_cuda_test --gtest_filter='*Mla*:*BatchInvariance*:-*Racecheck*' \
  > $OUT/attention.log 2>&1
echo "attention rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/attention.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK mla_.*(bf16act|h8_dn32|deepseek_h32_ps64_bf16pool_tc |h3_dn12_dr6_dv10_r20_ps16 )|FAIL" \
  $OUT/attention.log | head -20 >> $S
timeout 120 build-cuda/tests/model_cuda_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')" >> $S
grep -E "FAIL|Failure" $OUT/model.log | head -10 >> $S
timeout 60 build-cuda/tests/model_step_clock_cuda_test > $OUT/clock.log 2>&1
echo "clock rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/clock.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK|FAIL" $OUT/clock.log >> $S
B=build-cuda/bin/loom-bench
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for mode in gemm kernels; do
  [ $(left) -lt 70 ] && { echo "no time for $mode" >> $S; continue; }
  env $([ $mode = kernels ] && echo LOOM_MLA_PROJECTION_KERNELS=1) timeout $(( $(left) - 10 )) \
    $B offline $M --batches 1,64 --decode_steps 32 --prefill 8192,32768 \
    --json $OUT/offline-$mode.json > $OUT/offline-$mode.md 2>&1
  echo "offline $mode rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $OUT/offline-$mode.md >> $S
done
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
