# Session 19, call A: (1) last session's review fixes on the GPU (job-s18e's checks: attention
# MlaVarlen/BatchInvariance, norms, the step clock); (2) batch-1 decode at 4K through the engine
# (CUDA graphs); (3) ncu per kernel of one eager batch-1 step at 4K with the L2 left warm
# (--cache-control none: the graph's kernels do not flush L2 either), to split the graph step's time
# into kernel time and the gaps between kernels.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s19a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s19a} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
S=$OUT/summary.txt; : > $S
loom_configure || exit 1
loom_build attention_cuda_test model_step_clock_cuda_test cuda_kernels_test loom-bench \
  decode_step_profile >> $S || exit 1
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
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1"
timeout 90 build-cuda/bin/loom-bench offline $M --context 4096 --batches 1 --decode_steps 64 \
  --prefill 8192 > $OUT/offline.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $OUT/offline.md >> $S
[ $(left) -gt 50 ] && timeout $(( $(left) - 5 )) ncu --profile-from-start off --clock-control none \
  --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
  build-cuda/bin/decode_step_profile bench/configs/kimi_linear_48b_a3b 1 4096 5 \
  > $OUT/ncu-decode.txt 2>&1
echo "ncu decode rc=$? $(grep -E 'eager median' $OUT/ncu-decode.txt | head -3)" >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
