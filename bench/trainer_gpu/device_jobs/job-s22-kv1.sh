# Session 22, call kv1: FP8 KV pages on the GPU (issue 19 item 3). Builds the kernel test first
# and runs it, then the model test, the attention regression tests and loom-bench offline on the
# 48B-shaped model with --kv_dtype fp8 and bf16 (128K-token contexts, batch 1 and 8), each step
# guarded by the time left. Carry [".device-deps", ".device-clean", ".device-fx2"]; src kv1.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-470}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-kv1}
mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx2/fixtures-models.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -12 >> $S; }
loom_build kv_fp8_cuda_test >> $S || exit 1
echo "src $(cat .loom-src-rev); after kernel build $(( $(date +%s) - JOB_T0 )) s" >> $S
run_test kvfp8 90 $T/kv_fp8_cuda_test
grep -E "^GPUCHECK" $R/kvfp8.log | awk '{print $2, $3, $4, $5}' >> $R/kvfp8_checks.txt
grep -E "^GPUCHECK" $R/kvfp8.log | sort -k3 -g | tail -4 >> $S
# Build the rest while the next tests run on the kernels already built.
loom_build model_kv_fp8_cuda_test attention_cuda_test loom-bench >> $S || exit 1
echo "after build $(( $(date +%s) - JOB_T0 )) s" >> $S
run_test model 120 $T/model_kv_fp8_cuda_test
grep -E "^GPUCHECK|^GPUINFO" $R/model.log >> $S
run_test attn 120 $T/attention_cuda_test --gtest_filter='*MlaVarlen*:*GqaVarlen*:*BatchInvariance*'
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --prefill= --decode_steps 16"
# Batch 1 for both dtypes first, then batch 8 (a 1M-token prefill each) while time is left.
for B in 1 8; do for kv in fp8 bf16; do
  need=25; [ $B = 8 ] && need=90
  [ $(left) -lt $need ] && { echo "offline $kv batch $B skipped: $(left) s left" >> $S; continue; }
  timeout $(( $(left) - 5 )) $BIN/loom-bench offline $M --kv_dtype $kv --context 131072 --batches $B \
    --json $R/offline-$kv-b$B.json > $R/offline-$kv-b$B.md 2>&1
  echo "offline $kv batch $B rc=$?" >> $S
  grep -E "^loom-bench offline|^ceilings|^device memory|^KV pages|^\| [0-9]" $R/offline-$kv-b$B.md >> $S
done; done
