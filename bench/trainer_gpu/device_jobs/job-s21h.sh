# Session 21, call H: HEAD with the prefix cache's host tier (helper): the GPU prefix-cache,
# session and graph tests. Carry [".device-deps", ".device-clean", ".device-fx2"]; src s21h.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s21h}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build model_prefix_cache_cuda_test model_sessions_cuda_test model_graphs_cuda_test >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test prefix 90 $T/model_prefix_cache_cuda_test
run_test sessions 90 $T/model_sessions_cuda_test
run_test graphs 60 $T/model_graphs_cuda_test
