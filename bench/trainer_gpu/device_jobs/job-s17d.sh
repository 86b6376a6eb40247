# Session 17, call D (prepared; not run: the session's device time ran out): the trainer's
# `matmul: bf16` GEMMs (CUBLAS_COMPUTE_32F_FAST_16BF) against the CPU (backward_cuda_test,
# LinearTf32AndBf16 first), then, with LIMIT >= 200, the peer's small config trained by loom in
# tf32 and in bf16, one after the other (25 s each), for their step times.
# Carry [".device-deps", ".device-clean"]; src s17d.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-140}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s17d}
loom_configure || exit 1
targets=backward_cuda_test; [ $LIMIT -ge 200 ] && targets="backward_cuda_test loom-trainer"
loom_build $targets || exit 1
S=$OUT/summary.txt; : > $S
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 20 build-cuda/tests/backward_cuda_test --gtest_filter='CudaBackward.Linear*' > $OUT/linear.log 2>&1
echo "linear rc=$?" >> $S
grep -E "linear|PASSED|FAILED|Failure" $OUT/linear.log | head -30 >> $S
timeout 40 build-cuda/tests/backward_cuda_test > $OUT/all.log 2>&1
echo "all rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/all.log | tr '\n' ' ')" >> $S
if [ $LIMIT -ge 200 ]; then
  cfg=bench/peers/kda_train_config_small.json; B=16; TL=1024
  python3 bench/peers/random_shard.py --out /tmp/shard.bin --vocab 260 --tokens 4194304 > /dev/null
  for p in tf32 bf16; do
    cat > /tmp/run-$p.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": $(( TL - 1 ))},
 "batch_size": $B, "steps": 100000, "device": "cuda", "matmul": "$p",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 10},
 "out": "/tmp/loom-$p", "seed": 1}
JSON
    t=$(( $(left) - 8 )); [ $t -gt 25 ] && t=25
    [ $t -lt 10 ] && { echo "no time left for $p" >> $S; continue; }
    timeout $t build-cuda/bin/loom-trainer train --config /tmp/run-$p.json > /dev/null 2> $OUT/lp-$p.err
    python3 bench/peers/train_table.py loom --metrics /tmp/loom-$p/metrics.jsonl --config $cfg \
      --batch $B --seq-len $TL --skip 2 --label small-$p --rc 124 >> $S 2>&1
    head -c 300 /tmp/loom-$p/metrics.jsonl >> $S; echo >> $S
  done
fi
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
