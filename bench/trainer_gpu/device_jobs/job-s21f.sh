# Session 21, call F: the MoE permute's rank and copy in one kernel at decode sizes, MLA's decode
# kernels PDL-aware: MoE and attention tests, the model tests against the CPU and graph steps
# against eager steps (every fixture), then batch-1 / 8 / 64 decode.
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src s21f.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s21f}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build moe_cuda_test attention_cuda_test model_graphs_cuda_test model_cuda_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test moe 90 $T/moe_cuda_test
grep -E "moe_permute_(rows|x_sorted)_T(2|8|11)_" $R/moe.log | head -6 >> $S
run_test graphs 120 $T/model_graphs_cuda_test
grep -E "GPUINFO CUDA graphs" $R/graphs.log | head -8 >> $S
run_test attn 120 $T/attention_cuda_test --gtest_filter='*Mla*'
run_test model 200 $T/model_cuda_test
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for p in 1 1; do
  [ $(left) -gt 50 ] && LOOM_CUDA_PDL=$p LOOM_CUDA_PDL_REPORT=1 timeout 50 $BIN/loom-bench offline $M --batches 1 \
    --decode_steps 64 --prefill "" > $R/b1-$p.md 2> $R/b1-$p.err
  echo "b1 pdl $p rc=$? $(grep -E '^\| 1 ' $R/b1-$p.md)" >> $S
done
grep -E "^PDL report" $R/b1-1.err | head -1 >> $S
grep -E "^PDL plain [1-9]" $R/b1-1.err | head -12 | cut -c1-150 >> $S
[ $(left) -gt 80 ] && timeout 80 $BIN/loom-bench offline $M --batches 8,64 \
    --decode_steps 32 --prefill "" > $R/b864.md 2>&1
echo "b8/64 rc=$? $(grep -E '^\| [0-9]' $R/b864.md | tr '\n' ' ')" >> $S
