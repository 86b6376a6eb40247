# Session 15, call B: the register-tiled chunk gradient (kda_chunked_backward.cu) on the GPU --
# kda_chunked_backward_cuda_test, varlen_backward_cuda_test, kda_backward_cuda_bench -- then loom
# (tf32) against fla (bf16 weights) on the peer's small config in this one call, then ncu of 2 loom
# steps; backward_cuda_test has the multi-tensor AdamW. Carry [".device-deps", ".device-clean", ".device-tc2", ".peers"]; src s15b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s15b}
loom_configure || exit 1
TESTS="kda_chunked_backward_cuda_test varlen_backward_cuda_test backward_cuda_test"
loom_build loom-trainer $TESTS kda_backward_cuda_bench || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
for t in $TESTS; do
  timeout 120 build-cuda/tests/$t > $L/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/$t.log | tr '\n' ' ')" >> $S
done
grep -E "Failure|rel_l2|worst" $L/kda_chunked_backward_cuda_test.log | head -12 >> $S
grep -E "Failure" -A4 $L/*.log | head -20 >> $S
timeout 90 build-cuda/bin/kda_backward_cuda_bench > $L/bench.log 2>&1
echo "kda_backward_cuda_bench rc=$? at $(( $(date +%s) - JOB_T0 )) s" >> $S
grep -E "^KDABWD" $L/bench.log >> $S
cfg=bench/peers/kda_train_config_small.json; B=16; TL=1024
python3 bench/peers/random_shard.py --out /tmp/shard.bin --vocab 260 --tokens 4194304 > /dev/null
cat > /tmp/run-tf32.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": $(( TL - 1 ))},
 "batch_size": $B, "steps": 100000, "device": "cuda", "matmul": "tf32",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 10},
 "out": "/tmp/loom-tf32", "seed": 1}
JSON
timeout 35 build-cuda/bin/loom-trainer train --config /tmp/run-tf32.json > $L/lp-tf32.out 2> $L/lp-tf32.err
echo "loom tf32 rc=$? (124: the planned stop) at $(( $(date +%s) - JOB_T0 )) s" >> $S
python3 bench/peers/train_table.py loom --metrics /tmp/loom-tf32/metrics.jsonl --config $cfg \
  --batch $B --seq-len $TL --skip 2 --label small-tf32 --rc 124 >> $S 2>&1
head -c 600 /tmp/loom-tf32/metrics.jsonl > $L/loom-first.jsonl
export PYTHONPATH=$R/.peers/fla PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1 TRITON_CACHE_DIR=/tmp/triton-cache
cat $R/.device-tc2/triton-cache.tgz.part-* | tar -C /tmp -xz
t=$(( $(left) - 110 ))
timeout $t python3 bench/peers/fla_train.py --config $cfg --batch $B --seq-len $TL --precision bf16w \
  --shard /tmp/shard.bin --label small --warmup 3 --seconds 12 >> $L/peer.jsonl 2> $L/fla.err
echo "fla small bf16w rc=$? (timeout $t s) at $(( $(date +%s) - JOB_T0 )) s" >> $S
tail -3 $L/fla.err >> $S; cat $L/peer.jsonl >> $S
cat > /tmp/prof.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": $(( TL - 1 ))},
 "batch_size": $B, "steps": 2, "device": "cuda", "matmul": "tf32",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 1}, "out": "/tmp/prof", "seed": 1}
JSON
timeout $(( $(left) - 15 )) ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
  build-cuda/bin/loom-trainer train --config /tmp/prof.json > $L/ncu.txt 2> $L/ncu.err
echo "ncu rc=$? at $(( $(date +%s) - JOB_T0 )) s" >> $S
cp $L/ncu.txt $OUT/ncu.txt
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
