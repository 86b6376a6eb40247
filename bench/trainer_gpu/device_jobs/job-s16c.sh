# Session 16, call C: the bundled default's last stage. s16b's v1 (passkeys 80/80 to 4096, tool
# dialogues 8/16; its bf16 weights in .device-clean/v1) continues on passkeys and tool dialogues at
# 1024: w1 passkey 1 : tool 1 at lr 5e-4 (v1's run, further), w2 passkey 1 : tool 2 at 3e-4.
# Carry [".device-deps", ".device-clean"]; src s16c.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-430}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s16c}
loom_configure || exit 1
loom_build loom-trainer loom-convert || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
python3 - "$R" <<'PY'
import json, os, shutil, sys
R = sys.argv[1]
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 0
os.makedirs("/tmp/v1", exist_ok=True); json.dump(c, open("/tmp/v1/config.json", "w"), indent=1)
shutil.copy(R + "/.device-clean/v1/model.safetensors", "/tmp/v1/model.safetensors")
def cont(name, tool_weight, lr):
    r = {"model": {"checkpoint": "/tmp/v1"}, "device": "cuda",
         "data": {"task": "mix", "seq_len": 1024, "loss": "all",
                  "mix": [{"task": "passkey", "weight": 1}, {"task": "tool_dialogue", "weight": tool_weight}]},
         "batch_size": 32, "steps": 100000,
         "optimizer": {"peak_lr": lr, "min_lr": lr, "warmup_steps": 20, "total_steps": 100000},
         "checkpoint_every": 200, "out": "/tmp/run-" + name, "seed": 31}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
cont("w1", 1, 5e-4); cont("w2", 2, 3e-4)
PY
RUNS="w1 w2"
train_s=$(( $(left) - 70 ))
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
  ( timeout 45 $T eval --model /tmp/bf16-$v --task passkey --lengths 512,1024,2048,4096 --samples 4 --device cuda > $L/ev-$v-passkey.txt 2>&1 ) &
  ( timeout 45 $T eval --model /tmp/bf16-$v --task tool --samples 32 --device cuda > $L/ev-$v-tool.txt 2>&1 ) &
done
wait
for v in $RUNS; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
print('  %d steps, median step %.4f s' % (len(L), st.median(d)))
n=max(1,len(L)//16)
print('  ' + ' | '.join('%d:%.3f' % (L[i]['step'], st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
done
cp /tmp/run-*.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
