# Session 24's plan for the next lent H200 (none was lent in session 24), call A: the GPU tests
# that sessions 23 and 24 compiled but never ran: rl_routing_replay_cuda_test and rl_cuda_test
# (routing replay's CUDA twin, 28c1fab), kda_fused_cuda_test (324f0e4's routing), moe_fp8_cuda_test
# (106dfaf's plan reserve, AutoPlanScratchNeverExceedsTheLargestStep) and its memcheck,
# model_graphs / model_cuda (the per-device shared-memory opt-in, 2b0883b), then loom-bench offline
# with FP8 weights on the 48B-shaped model (issue 19's decode TPOT at batch 1 / 64 / 256, bf16 pages
# then fp8 pages), each step guarded by the time left.
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src s24a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-575}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
ROOT=$PWD
source .device-clean/device-env.sh ${SRC:-s24a}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $ROOT/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || { tail -20 $OUT/configure.log >> $S; exit 1; }
loom_build rl_routing_replay_cuda_test rl_cuda_test kda_fused_cuda_test moe_fp8_cuda_test \
  model_graphs_cuda_test model_cuda_test loom-bench >> $S || { grep -E "error" $OUT/build.log | head -20 >> $S; exit 1; }
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is|^\[replay cuda\]|^\[rl cuda\] replay" \
    $R/$name.log | head -14 >> $S; }
run_test replay 90 $T/rl_routing_replay_cuda_test
run_test rl 150 $T/rl_cuda_test
run_test kdafused 60 $T/kda_fused_cuda_test
run_test moefp8 90 $T/moe_fp8_cuda_test
run_test graphs 90 $T/model_graphs_cuda_test
run_test model 120 $T/model_cuda_test
if [ $(left) -gt 120 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  timeout 110 $CS --tool memcheck --kernel-name kns=loom --error-exitcode 1 $T/moe_fp8_cuda_test \
    --gtest_filter='*Wgmma*:*AutoPlan*' > $R/memcheck.log 2>&1
  echo "memcheck moe_fp8 rc=$? $(grep -E 'ERROR SUMMARY' $R/memcheck.log | head -1)" >> $S
fi
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --weight_dtype fp8"
for kv in bf16 fp8; do
  [ $(left) -lt 90 ] && { echo "offline fp8 weights, $kv pages skipped: $(left) s left" >> $S; continue; }
  timeout $(( $(left) - 10 )) $BIN/loom-bench offline $M --kv_dtype $kv --batches 1,64,256 \
    --decode_steps 32 --json $R/offline-fp8w-$kv.json > $R/offline-fp8w-$kv.md 2>&1
  echo "offline fp8 weights, $kv pages rc=$?" >> $S
  grep -E "^ceilings|^KV pages|^weights|^\| [0-9]" $R/offline-fp8w-$kv.md >> $S
done
