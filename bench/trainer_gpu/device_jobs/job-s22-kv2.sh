# Session 22, call kv2: FP8 KV pages on the wgmma MLA kernel (issue 19 item 3). Builds the fp8
# kernel test and the attention benchmark, then (the engine's bench building beside them) runs the
# test, the kernel benchmark over fp8 against bf16 pages (LOOM_BENCH_ONLY=mla_fp8), the bf16
# attention regression tests, loom-bench offline on the 48B-shaped model at 128K (fp8 then bf16,
# batch 1 then 8) and racecheck on the fp8 wgmma path, each step guarded by the time left.
# Carry [".device-deps", ".device-clean", ".device-fx2"]; src kv2.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-320}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-kv2}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)|^\[  SKIPPED' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -12 >> $S; }
loom_build kv_fp8_cuda_test attention_cuda_bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after kernel build $(( $(date +%s) - JOB_T0 )) s" >> $S
# The engine's bench and the bf16 attention test build while the GPU runs the kernel steps.
( cmake --build build-cuda -j 12 --target loom-bench attention_cuda_test > $OUT/build2.log 2>&1;
  echo "rc=$?" >> $OUT/build2.log ) &
BPID=$!
run_test kvfp8 100 $T/kv_fp8_cuda_test
grep -E "^GPUCHECK" $R/kvfp8.log | awk '{print $2, $3, $4, $5}' > $R/kvfp8_checks.txt
grep -E "wgmma|decode8|70001" $R/kvfp8_checks.txt | sort -k2 -g | tail -6 >> $S
grep -E "^GPUCHECK" $R/kvfp8.log | grep -v vs_bf16_pages | sort -k3 -g | tail -3 >> $S
grep -cE "^GPUINFO .* wgmma_fp8_calls [1-9]" $R/kvfp8.log | sed 's/^/calls on the fp8 wgmma kernel (cases): /' >> $S
LOOM_BENCH_ONLY=mla_fp8 timeout 60 $BIN/attention_cuda_bench > $R/attn_bench.log 2>&1
echo "attn_bench rc=$?" >> $S; grep -E "^GPUBENCH" $R/attn_bench.log >> $S
wait $BPID; tail -1 $OUT/build2.log >> $S
echo "after build 2 $(( $(date +%s) - JOB_T0 )) s" >> $S
run_test attn 60 $T/attention_cuda_test --gtest_filter='*MlaVarlen*:*BatchInvariance*'
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --prefill= --decode_steps 16"
for B in 1 8; do for kv in fp8 bf16; do
  need=50; [ $B = 8 ] && need=60
  [ $(left) -lt $need ] && { echo "offline $kv batch $B skipped: $(left) s left" >> $S; continue; }
  timeout $(( $(left) - 5 )) $BIN/loom-bench offline $M --kv_dtype $kv --context 131072 --batches $B \
    --json $R/offline-$kv-b$B.json > $R/offline-$kv-b$B.md 2>&1
  echo "offline $kv batch $B rc=$?" >> $S
  grep -E "^ceilings|^KV pages|^\| [0-9]" $R/offline-$kv-b$B.md >> $S
done; done
if [ $(left) -gt 25 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  LOOM_MLA_SYNC_HANDOFF=1 timeout $(( $(left) - 5 )) $CS --tool racecheck \
    --kernel-name kns=loom --error-exitcode 1 $T/kv_fp8_cuda_test \
    --gtest_filter='KvFp8Cuda.WgmmaRacecheckSmallSteps' > $R/racecheck.log 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|hazard' $R/racecheck.log | head -3 | tr '\n' ' ')" >> $S
  pass $R/racecheck.log >> $S
else echo "racecheck skipped: $(left) s left" >> $S; fi
