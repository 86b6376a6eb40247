# Session 20, call E: the expanded-MLA review fixes on the GPU. Carry as s20a; src s20e.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s20e} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build mla_expanded_cuda_test attention_cuda_test model_random_weights_cuda_test >> $S || exit 1
T=build-cuda/tests
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -8 >> $S; }
run_test expanded 60 $T/mla_expanded_cuda_test
run_test attn 90 $T/attention_cuda_test --gtest_filter='*MlaExpanded*:*MlaVarlen*'
grep -E "mla_expanded_" $R/attn.log | head -8 >> $S
run_test random 90 $T/model_random_weights_cuda_test --gtest_filter='*MlaExpanded*'
grep -E "mla_heads" $R/random.log >> $S
