# Issue 19, block-scaled FP8 wgmma grouped experts, call B: the consumers take each tile from the
# scale warp (no offset search between tiles), a cheaper gate/up epilogue (h / s as h * 448 / amax,
# silu's quotient by __fdividef), 16-byte bf16 y stores, the activation quantizer with 4 items in
# flight per warp (measured slower, 1.2-1.3 against 1.7-1.8 TB/s: not kept). moe_fp8_cuda_test +
# the quantizer's twin test, moe_fp8_cuda_bench at 256-131072 tokens, then ncu (a few sections) of
# the gate/up kernel at 16384 tokens.
# Carry [".device-deps", ".device-clean"]; src fp8moe-b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-150}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-fp8moe-b}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build moe_fp8_cuda_test moe_fp8_cuda_bench gemm_fp8_cuda_test >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is|error" $R/$name.log | head -12 >> $S; return $rc; }
run_test moefp8 45 $T/moe_fp8_cuda_test; trc=$?
grep -E "GPUCHECK moe_fp8_block|GPUINFO" $R/moefp8.log | awk '{print $2, $3, $4, $5}' | head -60 >> $S
run_test quant 20 $T/gemm_fp8_cuda_test --gtest_filter='*ActivationQuantization*'
if [ $trc -lt 124 ] && [ $(left) -gt 30 ]; then
  LOOM_BENCH_TOKENS=256,4096,16384,131072 timeout 30 $BIN/moe_fp8_cuda_bench > $R/bench.log 2>&1
  echo "bench rc=$?" >> $S
  grep -E "^GPUBENCH|^MOEFP8" $R/bench.log >> $S
  if [ $(left) -gt 20 ]; then
    LOOM_BENCH_TOKENS=16384 timeout $(( $(left) - 3 )) ncu --clock-control none \
      --kernel-name-base mangled --kernel-name regex:bs6kernelILb1 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats \
      $BIN/moe_fp8_cuda_bench > $R/ncu.txt 2>&1
    echo "ncu rc=$?" >> $S
  fi
else
  echo "bench skipped (test rc=$trc, left $(left) s)" >> $S
fi
