# Session 21, call A: programmatic dependent launch with L2 weight prefetch in the GEMVs
# (kernels/cuda/pdl.h): the PDL test and the graph tests, the MLA expanded prefill check rerun,
# then the engine's batch-1 decode with PDL off / on at several prefetch budgets, batch 8 and 64.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s21a.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s21a} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build gemm_cuda_test model_graphs_cuda_test model_random_weights_cuda_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -8 >> $S; }
run_test gemm 120 $T/gemm_cuda_test
grep -E "pdl_" $R/gemm.log | head -6 >> $S
LOOM_CUDA_PDL=0 run_test gemm_nopdl 60 $T/gemm_cuda_test --gtest_filter='*Pdl*'
run_test graphs 120 $T/model_graphs_cuda_test
grep -E "GPUINFO CUDA graphs" $R/graphs.log | head -3 >> $S
run_test random 120 $T/model_random_weights_cuda_test --gtest_filter='*MlaExpanded*'
grep -E "mla_heads|GPUCHECK" $R/random.log | head -6 >> $S
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for cfg in "0 16" "1 16" "1 0" "1 48" "1 4" "0 16"; do
  set -- $cfg
  [ $(left) -gt 70 ] && LOOM_CUDA_PDL=$1 LOOM_CUDA_PDL_PREFETCH_MB=$2 timeout 70 $BIN/loom-bench \
    offline $M --batches 1 --decode_steps 64 --prefill "" > $R/b1-$1-$2.md 2>&1
  echo "b1 pdl $1 mb $2 rc=$? $(grep -E '^\| 1 ' $R/b1-$1-$2.md)" >> $S
done
grep -E "^ceilings" $R/b1-1-16.md >> $S
for p in 0 1; do
  [ $(left) -gt 90 ] && LOOM_CUDA_PDL=$p timeout 90 $BIN/loom-bench offline $M --batches 8,64 \
    --decode_steps 32 --prefill "" > $R/b864-$p.md 2>&1
  echo "b8/64 pdl $p rc=$? $(grep -E '^\| [0-9]' $R/b864-$p.md | tr '\n' ' ')" >> $S
done
