# Session 18, call E (the last minutes): the review fixes' CUDA side: attention_cuda_test's MLA
# cases (GEMM projections only for calls with a multi-row sequence, o_lat's bf16 copy in q_lat's
# space), model_step_clock_cuda_test (EngineStats::device_clock), cuda_kernels_test's norms (the
# two norm kernels' passes shared), then an 8192-token prefill.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s18e.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-170}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s18e} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
S=$OUT/summary.txt; : > $S
loom_configure || exit 1
loom_build attention_cuda_test model_step_clock_cuda_test cuda_kernels_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 40 build-cuda/tests/attention_cuda_test --gtest_filter='*MlaVarlen*:*BatchInvariance*:-*Racecheck*' \
  > $OUT/attention.log 2>&1
echo "attention rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/attention.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK mla_deepseek_h32_ps64_bf16pool_bf16act |FAIL" $OUT/attention.log | head -6 >> $S
timeout 30 build-cuda/tests/cuda_kernels_test --gtest_filter='*Norm*' > $OUT/norm.log 2>&1
echo "norms rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/norm.log | tr '\n' ' ')" >> $S
timeout 30 build-cuda/tests/model_step_clock_cuda_test > $OUT/clock.log 2>&1
echo "clock rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/clock.log | tr '\n' ' ')" >> $S
grep -E "GPUINFO|FAIL" $OUT/clock.log >> $S
[ $(left) -gt 40 ] && timeout $(( $(left) - 3 )) build-cuda/bin/loom-bench offline --device cuda \
  --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 256 --batches 1 \
  --decode_steps 8 --prefill 8192 > $OUT/offline.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $OUT/offline.md >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
