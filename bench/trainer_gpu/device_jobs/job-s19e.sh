# Session 19, call E (the session's end state): call D's set (the MoE decode GEMV's one-wave
# grid, the shared expert and the KDA gate projections on a side stream, the fused KDA decode
# chain, add_rmsnorm, the fused shared-expert SwiGLU GEMV, the router on bf16 rows) plus the
# router's scores computed by the whole block; every GPU test those touch, then the engine at
# batch 1 / 8 / 64 with 4K contexts and 8K / 32K prefills (PNG from the report), then ncu per
# kernel of one batch-1 step. Everything under $OUT/r/ comes back as one tarball.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s19e.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-420}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s19e} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build gemm_cuda_test moe_cuda_test moe_cuda_bench cuda_kernels_test model_cuda_test \
  model_graphs_cuda_test model_fp8_cuda_test loom-bench decode_step_profile ${EXTRA_TARGETS:-} >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() {  # name timeout binary [args]
  local name=$1 t=$2; shift 2
  timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$" $R/$name.log | head -6 >> $S
}
run_test gemm 90 $T/gemm_cuda_test
run_test moe 90 $T/moe_cuda_test
run_test kernels 120 $T/cuda_kernels_test
for t in ${EXTRA_TESTS:-}; do run_test $t 120 $T/$t; done
run_test model 150 $T/model_cuda_test
run_test graphs 90 $T/model_graphs_cuda_test
run_test fp8 90 $T/model_fp8_cuda_test
timeout 60 $BIN/moe_cuda_bench decode > $R/moebench.log 2>&1
echo "moe bench rc=$?" >> $S; grep -E "GPUBENCH" $R/moebench.log | grep -v copy >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
[ $(left) -gt 130 ] && timeout 130 $BIN/loom-bench offline $M --batches 1,8,64 --decode_steps 48 \
  --prefill 8192,32768 --json $R/offline.json > $R/offline.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $R/offline.md >> $S
[ $(left) -gt 45 ] && timeout $(( $(left) - 8 )) ncu --profile-from-start off --clock-control none \
  --cache-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
  $BIN/decode_step_profile bench/configs/kimi_linear_48b_a3b 1 4096 3 > $R/ncu-decode.txt 2>&1
echo "ncu decode rc=$?" >> $S
