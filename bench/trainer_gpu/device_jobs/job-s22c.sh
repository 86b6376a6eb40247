# Session 22, call C: HostCacheTier waits on each blob's own device event instead of the stream
# (put's fill, take's copies out freed once their event is reached): the GPU session and prefix
# cache tests (every family in the carried fixtures, bit-identical to whole-history requests).
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src s22c.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s22c}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build model_sessions_cuda_test model_prefix_cache_cuda_test >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) skipped $(grep -c '^\[  SKIPPED' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test sessions 120 $T/model_sessions_cuda_test
run_test prefix 120 $T/model_prefix_cache_cuda_test
