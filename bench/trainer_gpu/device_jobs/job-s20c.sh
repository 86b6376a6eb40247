# Session 20, call C: loom-server --device cuda under load (issue 15 item 6): the server built on
# the device with both frontends (gRPC and protobuf from Debian packages, .device-grpc), the
# 48B-shaped model with random weights, `loom-bench serve` over HTTP at concurrency 1, 8, 32, 64
# (1024-token random prompts, 128 output tokens, streamed); a gRPC health probe if gRPC built.
# Carry [".device-deps", ".device-clean", ".device-grpc"]; src s20a.
set -u
JOB_T0=$(date +%s); ROOT=$PWD
source .device-clean/device-env.sh ${SRC:-s20a}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; kill $SRV 2>/dev/null; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
SRV=0
trap finish EXIT
dd=/tmp/loom-device-deps
tar -C $dd -xJf $ROOT/.device-grpc/grpc.tar.xz
export PATH=$PATH:$dd/usr/bin
# The system's OpenSSL where it has one (cmake's own libcurl needs it), Debian's otherwise.
for n in ssl crypto; do
  if [ -e /usr/lib/x86_64-linux-gnu/lib$n.so.3 ]; then
    rm -f $lib/lib$n.so.3; ln -sf /usr/lib/x86_64-linux-gnu/lib$n.so.3 $lib/lib$n.so
  fi
done
loom_configure -DLOOM_SERVER=ON || { tail -20 $OUT/configure.log >> $S; exit 1; }
grep -iE "grpc|protobuf" $OUT/configure.log | head -5 >> $S
loom_build loom-server loom-bench >> $S || { grep -E "error" $OUT/build.log | head -20 >> $S; exit 1; }
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
build-cuda/bin/loom-server --device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 \
  --port 0 --grpc_port 0 --max_num_seqs 64 --max_num_batched_tokens 8192 > $R/server.log 2>&1 &
SRV=$!
port=""
for _ in $(seq 900); do
  port=$(sed -n 's/.*http listening on .* (port \([0-9]*\)).*/\1/p' $R/server.log | head -n 1)
  [ -n "$port" ] && break
  kill -0 $SRV 2>/dev/null || break
  sleep 0.2
done
echo "server up after $(( $(date +%s) - JOB_T0 )) s on port '$port'" >> $S
grep -iE "memory|grpc listening|budget" $R/server.log | head -5 >> $S
[ -n "$port" ] || { tail -20 $R/server.log >> $S; exit 1; }
timeout 300 build-cuda/bin/loom-bench serve --url http://127.0.0.1:$port --concurrency 1,8,32,64 \
  --input_len 1024 --output_len 128 --vocab_lo 0 --vocab_hi 163840 --json $R/serve.json \
  --markdown $R/serve.md > $R/bench.log 2>&1
echo "serve rc=$?" >> $S; grep -E "^\| [0-9]" $R/serve.md >> $S; tail -3 $R/bench.log >> $S
curl -s http://127.0.0.1:$port/metrics | grep -E "^loom_(device|requests|step)" | head -20 > $R/metrics.txt
