# Session 23, KDA decode step (issue 15): one kernel per (row, key head) for a KDA / GDN layer's
# decode from the projections to the gated output norm (kernels/cuda/kda_decode_step.cu), where
# prepare, recurrence and gated norm ran. Bits against the separate ops, then the 48B engine's
# TPOT with LOOM_KDA_FUSED_DECODE=0 / 1 in the same run, then the graph and model tests.
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src s23k.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-330}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s23k}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build kda_fused_cuda_test kda_fused_test model_graphs_cuda_test model_cuda_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log) ($(( $(date +%s) - JOB_T0 )) s)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -12 >> $S; }
run_test kda_cpu 30 $T/kda_fused_test
run_test kda_fused 60 $T/kda_fused_cuda_test
grep -c "decode_step_.* PASS$" $R/kda_fused.log >> $S
grep -E "KDAFUSEDBENCH" $R/kda_fused.log >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
RUN=0
bench() { for fused in "$@"; do
  [ $(left) -gt 90 ] || break
  RUN=$((RUN + 1)); local f=$R/b$RUN-fused$fused
  LOOM_KDA_FUSED_DECODE=$fused LOOM_CUDA_PDL_REPORT=1 timeout 60 $BIN/loom-bench offline $M \
    --batches 1,8 --decode_steps 48 --prefill "" > $f.md 2> $f.err
  echo "run $RUN fused=$fused rc=$? $(grep -E '^\| (1|8) ' $f.md | tr '\n' ' ') ($(( $(date +%s) - JOB_T0 )) s)" >> $S
  grep -E "PDL report: " $f.err | sort | uniq -c | sort -rn | head -4 >> $S
done; }
bench 1 0
[ $(left) -gt 60 ] && run_test graphs 60 $T/model_graphs_cuda_test
bench 1 0
[ $(left) -gt 30 ] && run_test model $(( $(left) - 5 )) $T/model_cuda_test
