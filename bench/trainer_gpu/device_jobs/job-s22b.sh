# Session 22, call B: the expert GEMV finds its tile by one block scan (the down launch reads the
# gate/up launch's), a block per column block; the MoE combine adds the shared expert's output in the same kernel: MoE tests, graph and model tests
# against the CPU (every fixture), then batch-1 / 8 / 64 decode of the 48B-shaped model.
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src s22b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-480}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s22b}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build moe_cuda_test moe_cuda_bench model_graphs_cuda_test model_cuda_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test moe 90 $T/moe_cuda_test
grep -c "moe_combine_add_bits_.* 0 .*ok\|moe_combine_add_bits" $R/moe.log >> $S
grep -E "moe_combine_add_bits" $R/moe.log | head -3 >> $S
grep -E "moe_swiglu_.*(E256|E300)_decode" $R/moe.log | head -8 >> $S
timeout 60 $T/moe_cuda_bench decode > $R/mbench.log 2>&1
grep -E "^GPUBENCH" $R/mbench.log | head -8 >> $S
run_test graphs 120 $T/model_graphs_cuda_test
run_test model 200 $T/model_cuda_test
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for i in 1 2 3; do
  [ $(left) -gt 50 ] && timeout 50 $BIN/loom-bench offline $M --batches 1 \
    --decode_steps 64 --prefill "" > $R/b1-$i.md 2> $R/b1-$i.err
  echo "b1 run $i rc=$? $(grep -E '^\| 1 ' $R/b1-$i.md)" >> $S
done
[ $(left) -gt 80 ] && timeout 80 $BIN/loom-bench offline $M --batches 8,64 \
    --decode_steps 32 --prefill "" > $R/b864.md 2>&1
echo "b8/64 rc=$? $(grep -E '^\| [0-9]' $R/b864.md | tr '\n' ' ')" >> $S
