# Session 18, call A: (1) the trainer's `matmul: bf16` redone as explicit bf16 copies of both
# operands (s17d showed cuBLAS's FAST_16BF giving TF32's results to the last bit): backward_cuda_test
# with LinearTf32AndBf16; (2) the engine's device step clock: model_step_clock_cuda_test (host sleeps
# and the wall clock as oracles); (3) `loom-bench offline` on the 48B-shaped model with the new
# idle-gap columns, graphs on, then off at batch 1 and 64; (4) ncu per kernel over one 8192-token
# prefill of the 48B-shaped model (decode_step_profile's PREFILL); (5) the peer's small config
# trained in tf32 and in bf16 (15 s each) for their step times.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s18a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s18a} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
loom_configure || exit 1
loom_build backward_cuda_test model_step_clock_cuda_test loom-bench loom-trainer \
  decode_step_profile || exit 1
S=$OUT/summary.txt; : > $S
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 60 build-cuda/tests/backward_cuda_test > $OUT/backward.log 2>&1
echo "backward rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/backward.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK linear_(tf32|bf16)|Failure|no (bf16|TF32)" $OUT/backward.log >> $S
timeout 90 build-cuda/tests/model_step_clock_cuda_test > $OUT/clock.log 2>&1
echo "clock rc=$?" >> $S
grep -E "GPUCHECK|GPUINFO|Failure|^\[  (PASSED|FAILED)|Expected|Which is|actual" $OUT/clock.log >> $S
B=build-cuda/bin/loom-bench
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
timeout 150 $B offline $M --batches 1,8,64 --decode_steps 32 --prefill 8192 \
  --json $OUT/offline-graphs.json > $OUT/offline-graphs.md 2>&1
echo "offline graphs rc=$?" >> $S; cat $OUT/offline-graphs.md >> $S
if [ $(left) -gt 120 ]; then
  timeout 100 $B offline $M --batches 1,64 --decode_steps 32 --prefill "" --cuda_graphs=false \
    --json $OUT/offline-eager.json > $OUT/offline-eager.md 2>&1
  echo "offline eager rc=$?" >> $S; grep -A8 "^Decode" $OUT/offline-eager.md >> $S
fi
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 60 )) ncu --profile-from-start off --clock-control none \
    --metrics gpu__time_duration.sum --print-summary per-kernel \
    build-cuda/bin/decode_step_profile bench/configs/kimi_linear_48b_a3b 1 1 3 8192 \
    > $OUT/ncu-prefill.txt 2>&1
  echo "ncu prefill rc=$? $(grep -E 'PREFILLSTEP' $OUT/ncu-prefill.txt)" >> $S
fi
if [ $(left) -gt 45 ]; then
  cfg=bench/peers/kda_train_config_small.json; BS=16; TL=1024
  python3 bench/peers/random_shard.py --out /tmp/shard.bin --vocab 260 --tokens 4194304 > /dev/null
  for p in tf32 bf16; do
    cat > /tmp/run-$p.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": $(( TL - 1 ))},
 "batch_size": $BS, "steps": 100000, "device": "cuda", "matmul": "$p",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 10},
 "out": "/tmp/loom-$p", "seed": 1}
JSON
    t=$(( $(left) / 2 - 5 )); [ $t -gt 15 ] && t=15
    [ $t -lt 8 ] && { echo "no time left for $p" >> $S; continue; }
    timeout $t build-cuda/bin/loom-trainer train --config /tmp/run-$p.json > /dev/null 2> $OUT/lp-$p.err
    python3 bench/peers/train_table.py loom --metrics /tmp/loom-$p/metrics.jsonl --config $cfg \
      --batch $BS --seq-len $TL --skip 2 --label small-$p --rc 124 >> $S 2>&1
  done
fi
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
