# Session 19, call G: the router's top-k as 64-bit keys (kernels/cuda/moe.cu): moe_cuda_test (ids
# exactly the CPU's), model tests, moe_route's time at one token (bench and ncu), the engine at
# batch 1 and 8. Carry as before; src s19g.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s19g} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
trap 'echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R' EXIT
loom_configure || exit 1
loom_build moe_cuda_test moe_cuda_bench model_cuda_test model_graphs_cuda_test loom-bench >> $S || exit 1
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
for t in moe_cuda_test model_cuda_test model_graphs_cuda_test; do
  timeout 150 $T/$t > $R/$t.log 2>&1
  echo "$t rc=$? $(pass $R/$t.log)" >> $S; grep -E "^\[  FAILED|FAIL$" $R/$t.log | head -5 >> $S
done
timeout 60 $BIN/moe_cuda_bench decode > $R/moebench.log 2>&1
grep -E "GPUBENCH moe_route" $R/moebench.log >> $S
timeout 60 ncu --clock-control none --kernel-name regex:route_kernel --launch-count 1 \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum $BIN/moe_cuda_bench decode \
  > $R/ncu-route.txt 2>&1
grep -E "gpu__time|inst_executed" $R/ncu-route.txt >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
[ $(left) -gt 70 ] && timeout 70 $BIN/loom-bench offline $M --batches 1,8 --decode_steps 48 \
  --prefill "" > $R/offline.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $R/offline.md >> $S
