# Session 21, call G: the review's fixes (pinned blocks: a blob erased only after its copies; PDL
# only for kernels whose loaded code has the wait; refused edges stay plain; the PDL test with a
# norm in the chain): GEMM / session / graph tests. Carry [".device-deps", ".device-clean",
# ".device-fx2"]; src s21g.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s21g}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build gemm_cuda_test model_sessions_cuda_test model_graphs_cuda_test >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test gemm 120 $T/gemm_cuda_test
grep -E "pdl_" $R/gemm.log | head -3 >> $S
LOOM_CUDA_PDL=0 run_test gemm_nopdl 60 $T/gemm_cuda_test --gtest_filter='*Pdl*'
run_test sessions 150 $T/model_sessions_cuda_test
run_test graphs 120 $T/model_graphs_cuda_test
grep -E "GPUINFO CUDA graphs" $R/graphs.log | head -3 >> $S
