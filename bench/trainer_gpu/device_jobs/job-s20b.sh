# Session 20, call B: the 1,000,000-token request on the 48B-shaped model (issue 15): batch-1
# decode at 4K for the ratio, then one 1M-token prompt (chunked prefill, expanded MLA) and 16
# decode steps after it; device memory sampled every 5 s. Carry as before; src s20a.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s20a}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 5 > $R/mem.csv 2>&1 &
SMI=$!
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
timeout 540 build-cuda/bin/loom-bench offline $M --batches 1 --decode_steps 32 --prefill "" \
  --long_context 1000000 --long_decode_steps 16 --json $R/offline-1m.json > $R/offline-1m.md 2>&1
echo "offline rc=$?" >> $S; grep -E "^ceilings|^\| [0-9]|GiB|budget" $R/offline-1m.md >> $S
kill $SMI; sort -t, -k2 -n $R/mem.csv | tail -2 >> $S
