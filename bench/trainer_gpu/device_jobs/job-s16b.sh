# Session 16, call B: the bundled-default candidates continue s16a's run pa (passkeys at 512,
# 57/60 up to 2048; its bf16 weights in .device-clean/pa) on passkeys and tool dialogues at 1024:
# v1 passkey 1 : tool 1, v2 passkey 1 : tool 3. Beside them, passkeys by a length curriculum (128,
# 256, then 512 tokens) for data seeds 12 (which did not learn at 512 alone in s16a) and 13. And
# trainer_packed_cuda_test's DefaultShapedModelMatchesTheCpu with TF32 on dense MLPs.
# Carry [".device-deps", ".device-clean"]; src s16b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s16b}
loom_configure || exit 1
loom_build loom-trainer loom-convert trainer_packed_cuda_test || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
python3 - "$R" <<'PY'
import json, os, shutil, sys
R = sys.argv[1]
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 0
os.makedirs("/tmp/cfg-nope", exist_ok=True); json.dump(c, open("/tmp/cfg-nope/config.json", "w"), indent=1)
os.makedirs("/tmp/pa", exist_ok=True); shutil.copy("/tmp/cfg-nope/config.json", "/tmp/pa/config.json")
shutil.copy(R + "/.device-clean/pa/model.safetensors", "/tmp/pa/model.safetensors")
def cont(name, tool_weight):
    r = {"model": {"checkpoint": "/tmp/pa"}, "device": "cuda",
         "data": {"task": "mix", "seq_len": 1024, "loss": "all",
                  "mix": [{"task": "passkey", "weight": 1}, {"task": "tool_dialogue", "weight": tool_weight}]},
         "batch_size": 32, "steps": 100000,
         "optimizer": {"peak_lr": 5e-4, "min_lr": 5e-4, "warmup_steps": 20, "total_steps": 100000},
         "checkpoint_every": 200, "out": "/tmp/run-" + name, "seed": 21}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
cont("v1", 1); cont("v2", 3)
def curriculum(name, seed):
    r = {"model": {"config": "/tmp/cfg-nope/config.json", "seed": 1}, "device": "cuda",
         "data": {"task": "passkey", "seq_len": 512, "loss": "all"},
         "stages": [{"seq_len": 128, "min_steps": 600, "max_steps": 600, "passkey": {"min_context": 32}},
                    {"seq_len": 256, "min_steps": 600, "max_steps": 600, "passkey": {"min_context": 64}},
                    {"seq_len": 512, "min_steps": 100000, "max_steps": 100000}],
         "batch_size": 32, "steps": 100000,
         "optimizer": {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000},
         "checkpoint_every": 200, "out": "/tmp/run-" + name, "seed": seed}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
curriculum("c12", 12); curriculum("c13", 13)
PY
RUNS="v1 v2 c12 c13"
train_s=$(( $(left) - 85 ))
for v in $RUNS; do
  timeout $train_s $T train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
timeout 200 build-cuda/tests/trainer_packed_cuda_test --gtest_filter='*DefaultShaped*' > $L/packed.log 2>&1
echo "trainer_packed_cuda_test DefaultShaped rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/packed.log | tr '\n' ' ')" >> $S
grep -E "^default|Failure" -A2 $L/packed.log | head -30 >> $S
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in $RUNS; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
done
for v in v1 v2; do
  ( timeout 50 $T eval --model /tmp/bf16-$v --task passkey --lengths 512,1024,2048,4096 --samples 4 --device cuda > $L/ev-$v-passkey.txt 2>&1 ) &
  ( timeout 50 $T eval --model /tmp/bf16-$v --task tool --samples 16 --device cuda > $L/ev-$v-tool.txt 2>&1 ) &
done
for v in c12 c13; do
  ( timeout 50 $T eval --model /tmp/bf16-$v --task passkey --lengths 512,1024,2048 --samples 4 --device cuda > $L/ev-$v-passkey.txt 2>&1 ) &
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
print('  ' + ' | '.join('%d(%s):%.3f' % (L[i]['step'], L[i].get('seq_len','-'), st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
done
grep -h "dialogue" $L/ev-v?-tool.txt | head -8 >> $S
cp /tmp/run-*.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
