# Expanded-form MLA prefill kernel (helper session), call 2: four variants (8 or 4 warps a block,
# with or without skipping the rescale when every factor is 1), each built straight with nvcc,
# tested and benchmarked. Carry .device-deps and these files; src ${SRC:-x2}.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-x2}
S=$OUT/summary.txt; : > $S
FL="-std=c++20 -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] --expt-relaxed-constexpr -lineinfo -I. -isystem $dd/usr/include"
B=/tmp/b; mkdir -p $B
build() {  # name defines...
  local n=$1; shift
  nvcc $FL "$@" -Xptxas -v -c kernels/cuda/attention_mla_expanded.cu -o $B/k$n.o > $B/ptxas$n.log 2>&1 &&
  nvcc $FL -o $B/test$n $B/k$n.o tests/gpu/mla_expanded_cuda_test.cc -L$lib -lgtest -lgtest_main -lpthread > $B/b1$n.log 2>&1 &&
  nvcc $FL -o $B/bench$n $B/k$n.o kernels/cuda/random_fill.cu tests/gpu/mla_expanded_cuda_bench.cc > $B/b2$n.log 2>&1 ||
  { echo "build $n failed"; tail -5 $B/*$n.log; }
}
build w8 -DLOOM_MLA_EXPANDED_WARPS=8 >> $S &
build w8s -DLOOM_MLA_EXPANDED_WARPS=8 -DLOOM_MLA_EXPANDED_SKIP_RESCALE=1 >> $S &
build w4 -DLOOM_MLA_EXPANDED_WARPS=4 >> $S &
build w4s -DLOOM_MLA_EXPANDED_WARPS=4 -DLOOM_MLA_EXPANDED_SKIP_RESCALE=1 >> $S &
wait
echo "built at $(( $(date +%s) - JOB_T0 )) s" >> $S
for n in w8 w8s w4 w4s; do
  echo "== $n $(grep -E 'registers' $B/ptxas$n.log)" >> $S
  timeout 60 $B/bench$n > $B/bench$n.log 2>&1
  echo "bench rc=$?" >> $S; grep -E "^\| [a-z]" $B/bench$n.log >> $S
done
echo "benches done at $(( $(date +%s) - JOB_T0 )) s" >> $S
for n in w8 w8s w4 w4s; do
  timeout 60 $B/test$n > $B/test$n.log 2>&1
  echo "test $n rc=$? $(grep -E '^\[  (PASSED|FAILED)' $B/test$n.log | tr '\n' ' ') worst $(grep GPUCHECK $B/test$n.log | awk '{print $3}' | sort -g | tail -1)" >> $S
  grep -E "FAIL|Failure" $B/test$n.log | head -5 >> $S
done
cp $B/testw8s.log $OUT/test_w8s.log; cp $B/testw4s.log $OUT/test_w4s.log
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
