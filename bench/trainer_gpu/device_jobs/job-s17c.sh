# Session 17, call C: from s17b's p2 (16 pairs packed in 64 learned at step 377: default's config,
# RoPE MLA, tf32, batch 256, seed 11) on to spread queries, two curricula side by side, tf32, each stage
# but the last ending once its loss is below 0.05 (stages[i].target_loss): g: 64 packed, then
# spread over 128, 192, 256; j: 64 packed, then spread over 256 at once. Then MQAR evals over 256.
# Carry [".device-deps", ".device-clean"]; src s17c.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-470}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s17c}
loom_configure || exit 1
loom_build loom-trainer loom-convert || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
python3 - <<'PY'
import json, os
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 32
os.makedirs("/tmp/cfg-rope", exist_ok=True); json.dump(c, open("/tmp/cfg-rope/config.json", "w"), indent=1)
st = lambda n, spread, mx, target=None: dict(
    {"seq_len": n, "max_steps": mx, "mqar": {"spread": spread}},
    **({"target_loss": target} if target else {}))
def run(name, stages):
    r = {"model": {"config": "/tmp/cfg-rope/config.json", "seed": 1}, "device": "cuda",
         "data": {"task": "mqar", "seq_len": 64, "mqar": {"num_pairs": 16}},
         "batch_size": 256, "stages": stages, "matmul": "tf32",
         "stage_stability": {"window": 20, "tolerance": 0.01},
         "optimizer": {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000},
         "checkpoint_every": 50, "out": "/tmp/run-" + name, "seed": 11}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
run("g", [st(64, False, 1500, 0.05), st(128, True, 800, 0.05), st(192, True, 800, 0.05),
          st(256, True, 20000)])
run("j", [st(64, False, 1500, 0.05), st(256, True, 20000)])
PY
RUNS="g j"
train_s=$(( $(left) - 50 ))
for v in $RUNS; do
  timeout $train_s $T train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in $RUNS; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
  ( timeout 30 $T eval --model /tmp/bf16-$v --task mqar --samples 64 --mqar_pairs 16 --mqar_seq_len 256 --device cuda > $L/ev-$v-mqar256.txt 2>&1 ) &
done
wait
for v in $RUNS; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
print('  %d steps, median step %.4f s; stage ends: %s' % (len(L), st.median(d), [(l['step'], l['stage'], l['stage_ended']) for l in L if l.get('stage_ended')]))
n=max(1,len(L)//16)
print('  ' + ' | '.join('%d(%d):%.3f' % (L[i]['step'], L[i]['seq_len'], st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
  cp /tmp/bf16-$v/config.json $L/config-$v.json 2>/dev/null
done
cp /tmp/run-*.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
