# Session 19, call B: the decode fusions and kernel fixes, tested and timed. (1) add_rmsnorm
# (cuda_kernels_test: bits against add + norm, CPU twin), the split f32 GEMV (gemm_cuda_test), the
# MoE decode GEMV's one-wave variant (moe_cuda_test and moe_cuda_bench decode with
# LOOM_MOE_GEMV_VARIANT 0 and 1), model_cuda_test and model_graphs_cuda_test; (2) loom-bench offline
# at batch 1 both variants, then 8 and 64; (3) ncu sections of one route_kernel call.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s19b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-420}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s19b} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
S=$OUT/summary.txt; : > $S
loom_configure || exit 1
loom_build cuda_kernels_test gemm_cuda_test moe_cuda_test moe_cuda_bench model_cuda_test \
  model_graphs_cuda_test loom-bench decode_step_profile >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
timeout 60 $T/cuda_kernels_test --gtest_filter='*Norm*' > $OUT/norm.log 2>&1
echo "norms rc=$? $(pass $OUT/norm.log) fails: $(grep -c 'FAIL$' $OUT/norm.log)" >> $S
grep -E "GPUCHECK add_rmsnorm.*(D2304|FAIL)" $OUT/norm.log | head -12 >> $S
timeout 90 $T/gemm_cuda_test > $OUT/gemm.log 2>&1
echo "gemm rc=$? $(pass $OUT/gemm.log)" >> $S; grep -E "FAIL" $OUT/gemm.log | head -5 >> $S
for v in 0 1; do
  LOOM_MOE_GEMV_VARIANT=$v timeout 90 $T/moe_cuda_test > $OUT/moe-$v.log 2>&1
  echo "moe v$v rc=$? $(pass $OUT/moe-$v.log)" >> $S; grep -E "FAIL" $OUT/moe-$v.log | head -5 >> $S
  LOOM_MOE_GEMV_VARIANT=$v timeout 60 $T/moe_cuda_bench decode > $OUT/moebench-$v.log 2>&1
  echo "moe bench v$v rc=$?" >> $S; grep -E "GPUBENCH" $OUT/moebench-$v.log >> $S
done
timeout 150 $T/model_cuda_test > $OUT/model.log 2>&1
echo "model rc=$? $(pass $OUT/model.log)" >> $S; grep -E "^\[  FAILED|FAIL" $OUT/model.log | head -8 >> $S
timeout 90 $T/model_graphs_cuda_test > $OUT/graphs.log 2>&1
echo "graphs rc=$? $(pass $OUT/graphs.log)" >> $S; grep -E "^\[  FAILED" $OUT/graphs.log | head -5 >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
B=build-cuda/bin/loom-bench
for v in 0 1; do
  [ $(left) -gt 60 ] && LOOM_MOE_GEMV_VARIANT=$v timeout 60 $B offline $M --batches 1 \
    --decode_steps 48 --prefill "" > $OUT/offline-b1-v$v.md 2>&1
  echo "offline b1 v$v rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $OUT/offline-b1-v$v.md >> $S
done
[ $(left) -gt 90 ] && LOOM_MOE_GEMV_VARIANT=1 timeout 80 $B offline $M --batches 8,64 \
  --decode_steps 32 --prefill 8192 > $OUT/offline-b864.md 2>&1
echo "offline b8,64 rc=$?" >> $S; grep -E "^\| [0-9]" $OUT/offline-b864.md >> $S
[ $(left) -gt 45 ] && timeout $(( $(left) - 5 )) ncu --profile-from-start off --clock-control none \
  --cache-control none --kernel-name regex:route_kernel --launch-count 1 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats build-cuda/bin/decode_step_profile bench/configs/kimi_linear_48b_a3b \
  1 64 1 > $OUT/ncu-route.txt 2>&1
echo "ncu route rc=$?" >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
