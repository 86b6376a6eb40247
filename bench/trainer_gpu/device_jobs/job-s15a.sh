# Session 15, call A: GPU tests of the untested trainer changes (ce905c1 tape workspace, 3324c4f flat
# gradients, 8992b79 DP refusal on one GPU, 435026e CE targets), then three trainings side by side:
# the bundled-default candidate (def1's run) and the MQAR curriculum (c256, c128 of job-mq6).
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s15a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s15a} fixtures-train.tar.xz
loom_configure || exit 1
TESTS="trainer_cuda_test trainer_packed_cuda_test trainer_data_parallel_cuda_test loss_cuda_test"
loom_build loom-trainer loom-convert $TESTS || exit 1
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
export LOOM_GPU_FIXTURES=/tmp/fx
T=build-cuda/bin/loom-trainer
python3 - <<'PY'
import json, os
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 0
os.makedirs("/tmp/cfg-nope", exist_ok=True); json.dump(c, open("/tmp/cfg-nope/config.json", "w"), indent=1)
r = json.load(open("weights/default/train.json"))
r["model"] = {"config": "/tmp/cfg-nope/config.json", "seed": 1}
r["data"] = {"task": "mix", "seq_len": 1024, "loss": "all",
             "mix": [{"task": "passkey", "weight": 2}, {"task": "tool_dialogue", "weight": 1},
                     {"task": "mqar", "weight": 1}]}
r["batch_size"] = 32; r["steps"] = 100000; r["matmul"] = "tf32"
r["optimizer"] = {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000}
r["checkpoint_every"] = 200; r["out"] = "/tmp/run-def"; r["seed"] = 11
json.dump(r, open("/tmp/run-def.json", "w"), indent=1)
def run(name, stages):
    r = {"model": {"config": "/tmp/cfg-nope/config.json", "seed": 1}, "device": "cuda",
         "data": {"task": "mqar", "seq_len": 64, "mqar": {"num_pairs": 16}},
         "batch_size": 256, "stages": stages,
         "optimizer": {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000},
         "checkpoint_every": 100, "out": "/tmp/run-" + name, "seed": 11}
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
s64 = {"seq_len": 64, "min_steps": 450, "max_steps": 450, "mqar": {"spread": False}}
sp = lambda n, mx: {"seq_len": n, "min_steps": mx, "max_steps": mx, "mqar": {"spread": True}}
run("c256", [s64, sp(256, 20000)])
run("c128", [s64, sp(128, 150), sp(256, 20000)])
PY
for t in $TESTS; do
  timeout 90 build-cuda/tests/$t > $L/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/$t.log | tr '\n' ' ')" >> $S
done
grep -E "Failure" -A4 $L/*.log | head -20 >> $S
train_s=$(( $(left) - 75 ))
[ $train_s -lt 60 ] && { echo "only $train_s s left to train: stopping (raise LIMIT)" >> $S; exit 0; }
for v in def c256 c128; do
  timeout $train_s $T train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in def c256 c128; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
done
( timeout 40 $T eval --model /tmp/bf16-def --task passkey --lengths 1024,2048,4096 --samples 4 --device cuda > $L/ev-def-passkey.txt 2>&1
  timeout 15 $T eval --model /tmp/bf16-def --task tool --samples 16 --device cuda > $L/ev-def-tool.txt 2>&1 ) &
( timeout 15 $T eval --model /tmp/bf16-def --task mqar --samples 32 --mqar_pairs 16 --device cuda > $L/ev-def-mqar.txt 2>&1
  timeout 15 $T eval --model /tmp/bf16-def --task mqar --samples 32 --mqar_pairs 16 --mqar_seq_len 256 --device cuda > $L/ev-def-mqar256.txt 2>&1 ) &
for v in c256 c128; do
  ( timeout 15 $T eval --model /tmp/bf16-$v --task mqar --samples 32 --mqar_pairs 16 --mqar_seq_len 256 --device cuda > $L/ev-$v-mqar256.txt 2>&1
    timeout 15 $T eval --model /tmp/bf16-$v --task mqar --samples 32 --mqar_pairs 16 --device cuda > $L/ev-$v-mqar.txt 2>&1 ) &
done
wait
for v in def c256 c128; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
print('  %d steps, median step %.4f s; stage ends: %s' % (len(L), st.median(d), [(l['step'], l['stage']) for l in L if l.get('stage_ended')]))
n=max(1,len(L)//14)
print('  ' + ' | '.join('%d(%d):%.3f' % (L[i]['step'], L[i]['seq_len'], st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/bf16-$v/model.safetensors $OUT/$v-bf16.safetensors 2>/dev/null
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
done
cp /tmp/run-def.json /tmp/cfg-nope/config.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
