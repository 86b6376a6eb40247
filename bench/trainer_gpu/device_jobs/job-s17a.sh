# Session 17, call A: MQAR over 256 with 16 pairs from seed, four trainings side by side on the
# default's config (RoPE MLA unless noted), tf32, batch 128: rc: a curriculum gated on the loss
# (stages[i].target_loss): 16 pairs packed in 64, then spread over 128, then over 256; rc3: the
# same at lr 3e-3; rm: spread over 256 from the start with 1-16 pairs (data.mqar.min_pairs), then
# 16 once the loss is below 0.1; nm: rm with NoPE MLA. Then bf16 checkpoints and MQAR evals.
# Carry [".device-deps", ".device-clean"]; src s17a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s17a}
loom_configure || exit 1
loom_build loom-trainer loom-convert || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
python3 - <<'PY'
import json, os
for name, rope in (("rope", 32), ("nope", 0)):
    c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = rope
    os.makedirs("/tmp/cfg-" + name, exist_ok=True)
    json.dump(c, open("/tmp/cfg-%s/config.json" % name, "w"), indent=1)
def run(name, cfg, lr, stages):
    r = {"model": {"config": "/tmp/cfg-%s/config.json" % cfg, "seed": 1}, "device": "cuda",
         "data": {"task": "mqar", "seq_len": 256, "mqar": {"num_pairs": 16}},
         "batch_size": 128, "stages": stages, "matmul": "tf32",
         "optimizer": {"peak_lr": lr, "min_lr": lr, "warmup_steps": 50, "total_steps": 100000},
         "checkpoint_every": 100, "out": "/tmp/run-" + name, "seed": 11}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
st = lambda n, spread, mx, target=None, **m: dict(
    {"seq_len": n, "max_steps": mx, "mqar": dict({"spread": spread}, **m)},
    **({"target_loss": target} if target else {}))
cur = [st(64, False, 1200, 0.1), st(128, True, 1200, 0.1), st(256, True, 20000)]
mix = [st(256, True, 20000, 0.1, min_pairs=1), st(256, True, 20000)]
run("rc", "rope", 1e-3, cur); run("rc3", "rope", 3e-3, cur)
run("rm", "rope", 1e-3, mix); run("nm", "nope", 1e-3, mix)
PY
RUNS="rc rc3 rm nm"
train_s=$(( $(left) - 60 ))
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
  ( timeout 40 $T eval --model /tmp/bf16-$v --task mqar --samples 32 --mqar_pairs 16 --mqar_seq_len 256 --device cuda > $L/ev-$v-mqar256.txt 2>&1 ) &
  ( timeout 40 $T eval --model /tmp/bf16-$v --task mqar --samples 16 --mqar_pairs 16 --device cuda > $L/ev-$v-mqar64.txt 2>&1 ) &
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
done
cp /tmp/run-*.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
