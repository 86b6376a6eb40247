# Session 17, call B: does the mq4 recipe still learn MQAR? 16 pairs packed in 64 tokens on the
# default's config with RoPE MLA (qk_rope_head_dim 32), lr 1e-3, seed 11, five runs side by side:
# p1 f32 batch 256 (mq4's recipe) at HEAD; old: the same on f870c34 (mq4's commit), built beside
# it; p2 tf32 batch 256; p3 f32 batch 128; p4 f32 batch 256 data seed 12.
# Carry [".device-deps", ".device-clean"]; src s17b and s17old (git archive f870c34).
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s17b}
mkdir -p /tmp/src-old && tar -C /tmp/src-old -xJf $R/.device-clean/src-s17old.tar.xz
loom_configure || exit 1
( cd /tmp/src-old && cmake --preset cuda -DLOOM_FIXTURES_DIR=/tmp/fx \
    -DLOOM_OPENBLAS_LIB=$lib/openblas-pthread/libopenblas.so \
    -DLOOM_CBLAS_INCLUDE=$dd/usr/include/x86_64-linux-gnu/openblas-pthread > $OUT/configure-old.log 2>&1 &&
  cmake --build build-cuda -j 8 --target loom-trainer > $OUT/build-old.log 2>&1 ) &
old_build=$!
loom_build loom-trainer loom-convert || exit 1
wait $old_build || { echo "old build failed"; tail -20 $OUT/build-old.log; }
S=$OUT/summary.txt; : > $S; L=/tmp/logs; mkdir -p $L
echo "src $(cat .loom-src-rev), old $(cat /tmp/src-old/.loom-src-rev); after builds $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/bin/loom-trainer
python3 - <<'PY'
import json, os
c = json.load(open("weights/default/config.json")); c["mla"]["qk_rope_head_dim"] = 32
os.makedirs("/tmp/cfg-rope", exist_ok=True); json.dump(c, open("/tmp/cfg-rope/config.json", "w"), indent=1)
def run(name, batch, seed, tf32=False):
    r = {"model": {"config": "/tmp/cfg-rope/config.json", "seed": 1}, "device": "cuda",
         "data": {"task": "mqar", "seq_len": 64, "mqar": {"num_pairs": 16}},
         "batch_size": batch, "steps": 100000,
         "optimizer": {"peak_lr": 1e-3, "min_lr": 1e-3, "warmup_steps": 50, "total_steps": 100000},
         "checkpoint_every": 100, "out": "/tmp/run-" + name, "seed": seed}
    if tf32: r["matmul"] = "tf32"
    json.dump(r, open("/tmp/run-%s.json" % name, "w"), indent=1)
run("p1", 256, 11); run("old", 256, 11); run("p2", 256, 11, True); run("p3", 128, 11)
run("p4", 256, 12)
PY
RUNS="p1 old p2 p3 p4"
train_s=$(( $(left) - 45 ))
for v in $RUNS; do
  bin=$T; [ $v = old ] && bin=/tmp/src-old/build-cuda/bin/loom-trainer
  timeout $train_s $bin train --config /tmp/run-$v.json > $L/train-$v.out 2> $L/train-$v.err &
done
wait
echo "trained for at most $train_s s; at $(( $(date +%s) - JOB_T0 )) s" >> $S
for v in $RUNS; do
  ck=$(ls -d /tmp/run-$v/checkpoint-* 2>/dev/null | sort -V | tail -1)
  [ -z "$ck" ] && continue
  echo "$ck" > $L/ck-$v.txt
  build-cuda/bin/loom-convert --from $ck --to /tmp/bf16-$v --dtype bf16 > /dev/null 2>&1
  ( timeout 30 $T eval --model /tmp/bf16-$v --task mqar --samples 16 --mqar_pairs 16 --device cuda > $L/ev-$v-mqar64.txt 2>&1 ) &
done
wait
for v in $RUNS; do
  echo "== $v $(cat $L/ck-$v.txt 2>/dev/null)" >> $S
  python3 -c "
import json, statistics as st
L=[json.loads(l) for l in open('/tmp/run-$v/metrics.jsonl')]
d=[b['elapsed_s']-a['elapsed_s'] for a,b in zip(L[3:],L[4:])]
f=[l['step'] for l in L if l['loss'] < 0.05]
print('  %d steps, median step %.4f s; first loss < 0.05 at %s' % (len(L), st.median(d), f[0] if f else '-'))
n=max(1,len(L)//16)
print('  ' + ' | '.join('%d:%.3f' % (L[i]['step'], st.mean(x['loss'] for x in L[i:i+n])) for i in range(0,len(L),n)))
" >> $S 2>&1
  for f in $L/ev-$v-*.txt; do echo "  $(basename $f): $(tail -1 $f)" >> $S; done
  cp /tmp/run-$v/metrics.jsonl $L/metrics-$v.jsonl 2>/dev/null
done
cp /tmp/run-*.json $L/
tar -C /tmp -czf $OUT/logs.tgz logs 2>/dev/null
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
