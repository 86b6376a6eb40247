# Issue 19, block-scaled FP8 wgmma grouped experts (kernels/cuda/moe_fp8_wgmma.cu), call A: build,
# moe_fp8_cuda_test (every FP8 expert path; the new GEMMs against double oracles on quantized
# activations, the SwiGLU composition), the activation quantizer against its CPU twin
# (gemm_fp8_cuda_test), then moe_fp8_cuda_bench at 64-131072 tokens with this run's FP8 peak.
# Carry [".device-deps", ".device-clean"]; src fp8moe-a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-225}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-fp8moe-a}
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
t=$(( $(left) - 60 )); [ $t -gt 70 ] && t=70
run_test moefp8 $t $T/moe_fp8_cuda_test; trc=$?
grep -E "GPUCHECK moe_fp8_block|GPUINFO" $R/moefp8.log | awk '{print $2, $3, $4, $5}' | head -60 >> $S
run_test quant 20 $T/gemm_fp8_cuda_test --gtest_filter='*ActivationQuantization*'
if [ $trc -lt 124 ] && [ $(left) -gt 25 ]; then
  LOOM_BENCH_TOKENS=64,256,4096,16384,131072 timeout $(( $(left) - 5 )) $BIN/moe_fp8_cuda_bench > $R/bench.log 2>&1
  echo "bench rc=$?" >> $S
  grep -E "^GPUBENCH|^MOEFP8" $R/bench.log >> $S
else
  echo "bench skipped (test rc=$trc, left $(left) s)" >> $S
fi
