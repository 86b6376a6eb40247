# Session 15, call C: two trainings side by side. (1) The bundled-default candidate by a curriculum:
# the default's config with NoPE MLA, data mix passkey + tool dialogues (every token scored),
# stage 0 passkeys alone at 512 (what learned retrieval in mq5), then both at 1024. (2) MQAR 16
# pairs spread over 256, continued from call A's c128 weights (bf16, .device-clean/c128), batch 128.
# Evals: passkey to 4096 (4x 1024) and tool dialogues for (1), MQAR over 256 for (2).
# First: backward_cuda_test's AdamW tests (the multi-tensor update's bits) and an ncu source-level
# profile of one chunk-gradient launch. Carry [".device-deps", ".device-clean"]; src s15c.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-520}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s15c}
loom_configure || exit 1
loom_build loom-trainer loom-convert backward_cuda_test || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
timeout 60 build-cuda/tests/backward_cuda_test --gtest_filter='*AdamW*' > $L/backward_adamw.log 2>&1
echo "backward_cuda_test AdamW rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/backward_adamw.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK|Failure" -A3 $L/backward_adamw.log | head -12 >> $S
# Where the chunk gradient's time goes: one launch, every section, per source line.
cfg=bench/peers/kda_train_config_small.json
python3 bench/peers/random_shard.py --out /tmp/shard.bin --vocab 260 --tokens 1048576 > /dev/null
cat > /tmp/prof.json <<JSON
{"model": {"config": "$cfg", "seed": 1},
 "data": {"task": "shards", "shards": ["/tmp/shard.bin"], "seq_len": 1023},
 "batch_size": 16, "steps": 1, "device": "cuda", "matmul": "tf32",
 "optimizer": {"peak_lr": 3e-4, "warmup_steps": 1}, "out": "/tmp/prof", "seed": 1}
JSON
timeout 90 ncu --kernel-name regex:kda_chunk_gradient --launch-count 1 --set full --import-source yes \
  -o /tmp/kcg $T train --config /tmp/prof.json > $L/ncu-kcg.log 2>&1
echo "ncu kcg rc=$? at $(( $(date +%s) - JOB_T0 )) s" >> $S
ncu -i /tmp/kcg.ncu-rep --page details > $OUT/kcg-details.txt 2>&1
ncu -i /tmp/kcg.ncu-rep --page source --csv --print-source cuda > $OUT/kcg-source.csv 2>&1 \
  || ncu -i /tmp/kcg.ncu-rep --page source --csv > $OUT/kcg-source.csv 2>&1
ls -la $OUT/kcg-* >> $S
python3 - "$R" <<'PY'
import json, os, sys
R = sys.argv[1]
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 0
os.makedirs("/tmp/cfg-def", exist_ok=True); json.dump(c, open("/tmp/cfg-def/config.json", "w"), indent=1)
opt = {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000}
d = {"model": {"config": "/tmp/cfg-def/config.json", "seed": 1}, "device": "cuda", "matmul": "tf32",
     "data": {"task": "mix", "seq_len": 1024, "loss": "all",
              "mix": [{"task": "passkey", "weight": 1}, {"task": "tool_dialogue", "weight": 1}]},
     "stages": [{"seq_len": 512, "min_steps": 1500, "max_steps": 1500,
                 "mix": [{"task": "passkey", "weight": 1}]},
                {"seq_len": 1024, "min_steps": 100000, "max_steps": 100000}],
     "batch_size": 32, "optimizer": opt, "checkpoint_every": 250, "out": "/tmp/run-def", "seed": 11}
json.dump(d, open("/tmp/run-def.json", "w"), indent=1)
m = {"model": {"checkpoint": R + "/.device-clean/c128"}, "device": "cuda", "matmul": "tf32",
     "data": {"task": "mqar", "seq_len": 256, "mqar": {"num_pairs": 16, "spread": True}},
     "batch_size": 128, "steps": 100000, "optimizer": dict(opt, warmup_steps=20),
     "checkpoint_every": 200, "out": "/tmp/run-mq", "seed": 12}
json.dump(m, open("/tmp/run-mq.json", "w"), indent=1)
PY
train_s=$(( $(left) - 80 ))
[ $train_s -lt 60 ] && { echo "only $train_s s left to train: stopping (raise LIMIT)" >> $S; exit 0; }
for v in def mq; do
  timeout $train_s $T train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in def mq; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
done
( timeout 45 $T eval --model /tmp/bf16-def --task passkey --lengths 512,1024,2048,4096 --samples 4 --device cuda > $L/ev-def-passkey.txt 2>&1 ) &
( timeout 30 $T eval --model /tmp/bf16-def --task tool --samples 16 --device cuda > $L/ev-def-tool.txt 2>&1 ) &
( timeout 30 $T eval --model /tmp/bf16-mq --task mqar --samples 32 --mqar_pairs 16 --mqar_seq_len 256 --device cuda > $L/ev-mq-mqar256.txt 2>&1 ) &
wait
for v in def mq; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
print('  %d steps, median step %.4f s; stage ends: %s' % (len(L), st.median(d), [(l['step'], l.get('stage')) for l in L if l.get('stage_ended')]))
n=max(1,len(L)//14)
print('  ' + ' | '.join('%d(%s):%.3f' % (L[i]['step'], L[i].get('seq_len', '-'), st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
  cp /tmp/bf16-$v/config.json $L/$v-config.json 2>/dev/null
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
done
grep -E "^(512|1024|2048|4096)|depth" $L/ev-def-passkey.txt | head -30 >> $S
cp /tmp/run-def.json /tmp/run-mq.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
