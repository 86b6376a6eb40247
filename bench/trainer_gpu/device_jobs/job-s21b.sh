# Session 21, call B: PDL-aware decode kernels beyond the GEMVs (norms, KDA decode, MoE route /
# permute / combine / expert GEMV, rope, cache writes): graph tests, kernel tests, the engine's
# batch-1 decode with PDL off / on, the plain-edge report. Carry as s21a; src s21b.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s21b} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build model_graphs_cuda_test moe_cuda_test cuda_kernels_test kda_fused_cuda_test loom-bench >> $S || exit 1
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
T=build-cuda/tests; BIN=build-cuda/bin
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
run_test() { local name=$1 t=$2; shift 2; timeout $t "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(pass $R/$name.log) fails $(grep -c 'FAIL$' $R/$name.log)" >> $S
  grep -E "^\[  FAILED|FAIL$|Failure|Expected|Which is" $R/$name.log | head -8 >> $S; }
run_test graphs 120 $T/model_graphs_cuda_test
grep -E "GPUINFO CUDA graphs" $R/graphs.log | head -4 >> $S
run_test moe 90 $T/moe_cuda_test
run_test kernels 90 $T/cuda_kernels_test
run_test kdafused 60 $T/kda_fused_cuda_test
M="--device cuda --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096"
for p in 0 1 0 1; do
  [ $(left) -gt 70 ] && LOOM_CUDA_PDL=$p LOOM_CUDA_PDL_REPORT=$p timeout 70 $BIN/loom-bench \
    offline $M --batches 1 --decode_steps 64 --prefill "" > $R/b1-$p.md 2> $R/b1-$p.err
  echo "b1 pdl $p rc=$? $(grep -E '^\| 1 ' $R/b1-$p.md)" >> $S
done
grep -E "^ceilings" $R/b1-1.md >> $S
grep -E "^PDL report" $R/b1-1.err | head -2 >> $S
grep -E "^PDL plain" $R/b1-1.err | head -40 | cut -c1-160 >> $S
[ $(left) -gt 90 ] && LOOM_CUDA_PDL=1 timeout 90 $BIN/loom-bench offline $M --batches 8,64 \
    --decode_steps 32 --prefill "" > $R/b864.md 2>&1
echo "b8/64 pdl 1 rc=$? $(grep -E '^\| [0-9]' $R/b864.md | tr '\n' ' ')" >> $S
