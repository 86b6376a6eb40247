# Session 16, call A: the GPU tests of last session's untested changes (ae2571f taped attention
# outputs, 16d8731 fused conv backward, 0543fab chunk-gradient helpers) and the new
# DefaultShapedModelMatchesTheCpu; the peer's small config timed (loom only); then three passkey
# runs side by side to find why s15c's passkey stage did not learn where mq5's did: (a) mq5's run
# (task passkey at 512, every token scored, f32, seed 11), (b) (a) in TF32, (c) (a) with seed 12.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s16a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s16a} fixtures-train.tar.xz
loom_configure || exit 1
TESTS="trainer_packed_cuda_test backward_cuda_test varlen_backward_cuda_test kda_chunked_backward_cuda_test trainer_cuda_test"
loom_build loom-trainer loom-convert $TESTS kda_backward_cuda_bench || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
export LOOM_GPU_FIXTURES=/tmp/fx
T=build-cuda/bin/loom-trainer
python3 - <<'PY'
import json, os
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 0
os.makedirs("/tmp/cfg-nope", exist_ok=True); json.dump(c, open("/tmp/cfg-nope/config.json", "w"), indent=1)
opt = {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000}
def run(name, seed, tf32):
    r = {"model": {"config": "/tmp/cfg-nope/config.json", "seed": 1}, "device": "cuda",
         "data": {"task": "passkey", "seq_len": 512, "loss": "all"},
         "batch_size": 32, "steps": 100000, "optimizer": opt,
         "checkpoint_every": 200, "out": "/tmp/run-" + name, "seed": seed}
    if tf32: r["matmul"] = "tf32"
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
run("pa", 11, False); run("pb", 11, True); run("pc", 12, False)
PY
# The trainings start now, beside the tests (the tests' timings do not matter; the runs' do not
# either: each stops at its time limit).
train_s=$(( $(left) - 75 ))
for v in pa pb pc; do
  timeout $train_s $T train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
for t in $TESTS; do
  timeout 150 build-cuda/tests/$t > $L/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/$t.log | tr '\n' ' ')" >> $S
done
grep -E "default \(|cuda vs cpu|gradcheck cuda|worst rel" $L/trainer_packed_cuda_test.log $L/trainer_cuda_test.log | head -20 >> $S
grep -E "Failure" -A4 $L/*.log | head -30 >> $S
timeout 60 build-cuda/bin/kda_backward_cuda_bench > $L/bench.log 2>&1
echo "kda_backward_cuda_bench rc=$? at $(( $(date +%s) - JOB_T0 )) s (3 trainings alongside)" >> $S
grep -E "^KDABWD" $L/bench.log >> $S
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in pa pb pc; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
  ( timeout 40 $T eval --model /tmp/bf16-$v --task passkey --lengths 512,1024,2048 --samples 4 --device cuda > $L/ev-$v.txt 2>&1 ) &
done
wait
for v in pa pb pc; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
print('  %d steps, median step %.4f s' % (len(L), st.median(d)))
n=max(1,len(L)//16)
print('  ' + ' | '.join('%d:%.3f' % (L[i]['step'], st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  echo "  eval: $(tail -1 $L/ev-$v.txt 2>/dev/null)" >> $S
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
done
cp /tmp/run-p?.json $L/
# The peer's small config, loom alone (tf32), to compare with s15b's 35.7 ms a step.
cfg=bench/peers/kda_train_config_small.json; B=16; TL=1024
python3 bench/peers/random_shard.py --out /tmp/shard.bin --vocab 260 --tokens 4194304 > /dev/null
cat > /tmp/run-tf32.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": $(( TL - 1 ))},
 "batch_size": $B, "steps": 100000, "device": "cuda", "matmul": "tf32",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 10},
 "out": "/tmp/loom-tf32", "seed": 1}
JSON
t=$(( $(left) - 8 )); [ $t -gt 30 ] && t=30
timeout $t $T train --config /tmp/run-tf32.json > $L/lp-tf32.out 2> $L/lp-tf32.err
echo "loom tf32 rc=$? (124: the planned stop, $t s) at $(( $(date +%s) - JOB_T0 )) s" >> $S
python3 bench/peers/train_table.py loom --metrics /tmp/loom-tf32/metrics.jsonl --config $cfg \
  --batch $B --seq-len $TL --skip 2 --label small-tf32 --rc 124 >> $S 2>&1
head -c 400 /tmp/loom-tf32/metrics.jsonl >> $S
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
