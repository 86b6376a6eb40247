# Session 19, call C: the GEMV and MoE-GEMV one-wave variants (LOOM_GEMV_VARIANT,
# LOOM_MOE_GEMV_VARIANT) tested and timed, the fused SwiGLU GEMV (gemm_cuda_test), the model
# tests, the engine at batch 1 per variant, ncu sections of the router's top-k. Everything under
# $OUT/r/ comes back as one tarball.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s19c.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s19c} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build gemm_cuda_test moe_cuda_test moe_cuda_bench gemm_cuda_bench model_cuda_test \
  model_graphs_cuda_test loom-bench decode_step_profile ${EXTRA_TARGETS:-} >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
for v in 0 1; do
  LOOM_GEMV_VARIANT=$v timeout 90 $T/gemm_cuda_test > $R/gemm-$v.log 2>&1
  echo "gemm v$v rc=$? $(pass $R/gemm-$v.log) fails $(grep -c 'FAIL$' $R/gemm-$v.log)" >> $S
  grep -E "FAIL$" $R/gemm-$v.log | head -5 >> $S
done
grep -E "swiglu.*M1_N1024" $R/gemm-0.log | head -4 >> $S
for v in 1 2; do
  LOOM_MOE_GEMV_VARIANT=$v timeout 90 $T/moe_cuda_test > $R/moe-$v.log 2>&1
  echo "moe v$v rc=$? $(pass $R/moe-$v.log)" >> $S
done
for v in 0 1 2; do
  LOOM_MOE_GEMV_VARIANT=$v timeout 60 $BIN/moe_cuda_bench decode > $R/moebench-$v.log 2>&1
  echo "moe bench v$v rc=$?" >> $S; grep -E "GPUBENCH" $R/moebench-$v.log | grep -v copy >> $S
done
for v in 0 1; do
  LOOM_GEMV_VARIANT=$v timeout 60 $BIN/gemm_cuda_bench decode > $R/gemvbench-$v.log 2>&1
  echo "gemv bench v$v rc=$?" >> $S; grep -E "GEMMROW gemv" $R/gemvbench-$v.log >> $S
done
LOOM_GEMV_VARIANT=1 LOOM_MOE_GEMV_VARIANT=1 timeout 150 $T/model_cuda_test > $R/model.log 2>&1
echo "model rc=$? $(pass $R/model.log)" >> $S; grep -E "^\[  FAILED" $R/model.log | head -8 >> $S
LOOM_GEMV_VARIANT=1 LOOM_MOE_GEMV_VARIANT=1 timeout 90 $T/model_graphs_cuda_test > $R/graphs.log 2>&1
echo "graphs rc=$? $(pass $R/graphs.log)" >> $S; grep -E "^\[  FAILED" $R/graphs.log | head -5 >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for gv in "0 0" "1 1" "1 2" "0 0"; do
  set -- $gv
  [ $(left) -gt 60 ] && LOOM_GEMV_VARIANT=$1 LOOM_MOE_GEMV_VARIANT=$2 timeout 60 $BIN/loom-bench \
    offline $M --batches 1 --decode_steps 64 --prefill "" > $R/offline-b1-$1$2.md 2>&1
  echo "offline b1 gemv $1 moe $2 rc=$? $(grep -E '^\| 1 ' $R/offline-b1-$1$2.md)" >> $S
done
[ $(left) -gt 45 ] && timeout $(( $(left) - 8 )) ncu --profile-from-start off --clock-control none \
  --cache-control none --kernel-name regex:route_kernel --launch-count 1 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats $BIN/decode_step_profile bench/configs/kimi_linear_48b_a3b \
  1 64 1 > $R/ncu-route.txt 2>&1
echo "ncu route rc=$?" >> $S
