# Session 23, call A: the GPU tests last session left unrun (moe_cuda_test after the tile-search
# and combine-add changes, kv_fp8_cuda_test and racecheck of the fp8 wgmma MLA path,
# model_host_tier_cuda_test, attention_cuda_test after plan_latent's fp8 refusal), then issue 18's
# agent trace on loom-server --device cuda with the 48B-shaped model: the whole-history modes
# (none, then prefix), each under a time budget, on the 1M-token trace that call B replays with
# sessions. loom-server is built here with gRPC (.device-grpc, as job-s20c.sh).
# Carry [".device-deps", ".device-clean", ".device-grpc"]; src s23a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-575}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
ROOT=$PWD
source .device-clean/device-env.sh ${SRC:-s23a}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
tar -C $dd -xJf $ROOT/.device-grpc/grpc.tar.xz
export PATH=$PATH:$dd/usr/bin
for n in ssl crypto; do
  if [ -e /usr/lib/x86_64-linux-gnu/lib$n.so.3 ]; then
    rm -f $lib/lib$n.so.3; ln -sf /usr/lib/x86_64-linux-gnu/lib$n.so.3 $lib/lib$n.so
  fi
done
loom_configure -DLOOM_SERVER=ON || { tail -20 $OUT/configure.log >> $S; exit 1; }
loom_build moe_cuda_test kv_fp8_cuda_test model_host_tier_cuda_test attention_cuda_test \
  loom-server >> $S || { grep -E "error" $OUT/build.log | head -20 >> $S; exit 1; }
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -10 >> $S; }
run_test hosttier 60 $T/model_host_tier_cuda_test
run_test moe 90 $T/moe_cuda_test
run_test kvfp8 100 $T/kv_fp8_cuda_test
run_test attn 120 $T/attention_cuda_test
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
LOOM_MLA_SYNC_HANDOFF=1 timeout 90 $CS --tool racecheck --kernel-name kns=loom --error-exitcode 1 \
  $T/kv_fp8_cuda_test --gtest_filter=KvFp8Cuda.WgmmaRacecheckSmallSteps > $R/racecheck.log 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|hazard' $R/racecheck.log | head -3 | tr '\n' ' ')" >> $S
echo "after tests $(( $(date +%s) - JOB_T0 )) s" >> $S
A="bench/agent/agent_sessions_bench.py --server $BIN/loom-server --model bench/configs/kimi_linear_48b_a3b"
SA="--device cuda --random_weights 1 --max_model_len 1048576 --max_body_bytes 16777216"
TR="--target_tokens 1000000 --turns 30 --timeout_s 400"
python3 $A --server_args "$SA" $TR --modes none --mode_budget_s 60 --json $R/agent-none.json \
  --markdown $R/agent-none.md > $R/agent-none.out 2> $R/agent-none.err
echo "agent none rc=$? $(tail -2 $R/agent-none.err | tr '\n' ' ')" >> $S
B=$(( $(left) - 45 ))
if [ $B -gt 30 ]; then
  python3 $A --server_args "$SA" $TR --modes prefix --mode_budget_s $B --json $R/agent-prefix.json \
    --markdown $R/agent-prefix.md > $R/agent-prefix.out 2> $R/agent-prefix.err
  echo "agent prefix (budget $B s) rc=$? $(tail -2 $R/agent-prefix.err | tr '\n' ' ')" >> $S
fi
grep -hE "turn" $R/agent-*.err | tail -40 >> $S
