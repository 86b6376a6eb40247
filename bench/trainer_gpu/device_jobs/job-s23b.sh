# Session 23, call B: issue 18's agent trace on loom-server --device cuda with the 48B-shaped model,
# sessions mode (POST /v1/responses with previous_response_id: only the new items each turn), on
# the same 1M-token trace call A replayed in the whole-history modes; run right after call A so the
# device's build of loom-server is still there (otherwise it is rebuilt: ~80 s).
# Carry [".device-deps", ".device-clean", ".device-grpc"]; src s23a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
ROOT=$PWD
source .device-clean/device-env.sh ${SRC:-s23a}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
[ -x $dd/usr/bin/grpc_cpp_plugin ] || tar -C $dd -xJf $ROOT/.device-grpc/grpc.tar.xz
export PATH=$PATH:$dd/usr/bin
for n in ssl crypto; do
  if [ -e /usr/lib/x86_64-linux-gnu/lib$n.so.3 ]; then
    rm -f $lib/lib$n.so.3; ln -sf /usr/lib/x86_64-linux-gnu/lib$n.so.3 $lib/lib$n.so
  fi
done
loom_configure -DLOOM_SERVER=ON || { tail -20 $OUT/configure.log >> $S; exit 1; }
loom_build loom-server >> $S || { grep -E "error" $OUT/build.log | head -20 >> $S; exit 1; }
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
BIN=build-cuda/bin
A="bench/agent/agent_sessions_bench.py --server $BIN/loom-server --model bench/configs/kimi_linear_48b_a3b"
SA="--device cuda --random_weights 1 --max_model_len 1048576 --max_body_bytes 16777216"
TR="--target_tokens 1000000 --turns 30 --timeout_s 400"
B=$(( $(left) - 40 ))
python3 $A --server_args "$SA" $TR --modes sessions --mode_budget_s $B --json $R/agent-sessions.json \
  --markdown $R/agent-sessions.md > $R/agent-sessions.out 2> $R/agent-sessions.err
echo "agent sessions (budget $B s) rc=$?" >> $S
grep -hE "turn|stopping" $R/agent-sessions.err | tail -34 >> $S
