# Expanded-form MLA prefill kernel (helper session): build only its test and benchmark straight
# with nvcc (CMake fallback), run the test, a memcheck of the strided cases, the benchmark and
# PyTorch's SDPA peer. Carry .device-deps .device-clean; src ${SRC:-x1}.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-x1}
S=$OUT/summary.txt; : > $S
FL="-std=c++20 -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] --expt-relaxed-constexpr -lineinfo -I. -isystem $dd/usr/include"
B=/tmp/b; mkdir -p $B
nvcc $FL -Xptxas -v -c kernels/cuda/attention_mla_expanded.cu -o $B/k.o > $B/ptxas.log 2>&1
grep -E "registers|spill" $B/ptxas.log >> $S
nvcc $FL -o $B/mla_expanded_cuda_test $B/k.o tests/gpu/mla_expanded_cuda_test.cc -L$lib -lgtest -lgtest_main -lpthread > $B/b1.log 2>&1 &&
nvcc $FL -o $B/mla_expanded_cuda_bench $B/k.o kernels/cuda/random_fill.cu tests/gpu/mla_expanded_cuda_bench.cc > $B/b2.log 2>&1
if [ $? -ne 0 ]; then
  echo "fast build failed:" >> $S; tail -5 $B/b1.log $B/b2.log >> $S
  loom_configure && loom_build mla_expanded_cuda_test mla_expanded_cuda_bench >> $S || exit 1
  cp build-cuda/tests/mla_expanded_cuda_test build-cuda/bin/mla_expanded_cuda_bench $B/
fi
echo "built at $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 150 $B/mla_expanded_cuda_test > $OUT/test.log 2>&1
echo "test rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/test.log | tr '\n' ' ')" >> $S
grep -E "GPUCHECK|Failure|FAILED|Expected|Which is|LOOM_GPU_TEST_SEED" $OUT/test.log | head -40 >> $S
echo "test done at $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 100 $B/mla_expanded_cuda_bench > $OUT/bench.log 2>&1
echo "bench rc=$?" >> $S; grep -E "^\||GPUBENCH" $OUT/bench.log >> $S
echo "bench done at $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 60 compute-sanitizer --tool memcheck --print-limit 5 $B/mla_expanded_cuda_test --gtest_filter='*Strided*' > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)" >> $S
echo "memcheck done at $(( $(date +%s) - JOB_T0 )) s" >> $S
PYTHONUNBUFFERED=1 timeout 90 python3 tests/gpu/mla_expanded_peer.py > $OUT/peer.log 2>&1
echo "peer rc=$?" >> $S; cat $OUT/peer.log | tail -12 >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
