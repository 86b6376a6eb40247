# Session 20, call A: MLA's expanded form for long prefill chunks (attention_mla_expanded.cu, the
# mixed dispatch in kernels/cuda/attention.cc): its kernel test and benchmark, the attention
# tests against the CPU, the whole-model GPU tests (prefills now take the expanded form), then
# the engine: batch-1 decode at 4K, 8K / 32K prefills, a 128K-token request.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s20a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s20a} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build mla_expanded_cuda_test mla_expanded_cuda_bench attention_cuda_test model_cuda_test \
  model_prefix_cache_cuda_test model_graphs_cuda_test model_random_weights_cuda_test loom-bench ${EXTRA_TARGETS:-} >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() {  # name timeout binary [args]
  local name=$1 t=$2; shift 2
  timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$" $R/$name.log | head -8 >> $S
}
run_test expanded 90 $T/mla_expanded_cuda_test
run_test attn_expanded 90 $T/attention_cuda_test --gtest_filter='*MlaExpanded*:*MlaVarlen*:*BatchInvariance*'
grep -E "mla_expanded_" $R/attn_expanded.log | head -12 >> $S
timeout 90 $BIN/mla_expanded_cuda_bench > $R/xbench.log 2>&1
echo "xbench rc=$?" >> $S; grep -E "^\|" $R/xbench.log >> $S
run_test random 120 $T/model_random_weights_cuda_test --gtest_filter='*MlaExpanded*:*ForwardMatchesCpu*'
grep -E "GPUCHECK mla_heads|GPUINFO mla_heads" $R/random.log >> $S
run_test model 150 $T/model_cuda_test
run_test prefix 120 $T/model_prefix_cache_cuda_test
run_test graphs 90 $T/model_graphs_cuda_test
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
[ $(left) -gt 150 ] && timeout $(( $(left) - 10 )) $BIN/loom-bench offline $M --batches 1 \
  --decode_steps 32 --prefill 8192,32768 --long_context 131072 --json $R/offline.json \
  > $R/offline.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]" $R/offline.md >> $S
