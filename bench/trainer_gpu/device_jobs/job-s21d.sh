# Session 21, call D: session copies batched (copy_batch_async): the session test on every family
# (kimi_linear_s1 / b0 added), restore vs recompute again on the 48B-shaped model.
# Carry as s21a; src s21d.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s21d}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-sessions.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx

R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build model_sessions_cuda_test loom-bench-session-offload >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -12 >> $S; }
run_test sessions 200 $T/model_sessions_cuda_test
grep -E "GPUCHECK|GPUINFO" $R/sessions.log | head -24 >> $S
[ $(left) -gt 60 ] && timeout $(( $(left) - 15 )) $BIN/loom-bench-session-offload \
  --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --device cuda \
  --histories 32768,131072 --turns 3 --new_tokens 16 --max_num_batched_tokens 8192 \
  --cache_budget_mb 16384 > $R/offload.md 2> $R/offload.err
echo "offload rc=$?" >> $S; cat $R/offload.md >> $S; tail -5 $R/offload.err >> $S
