# Session 17, call D (the session's last 4.6 minutes): the trainer's `matmul: bf16` GEMMs
# (CUBLAS_COMPUTE_32F_FAST_16BF) against the CPU: backward_cuda_test, LinearTf32AndBf16 first.
# Carry [".device-deps", ".device-clean"]; src s17d.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s17d}
loom_configure || exit 1
loom_build backward_cuda_test || exit 1
S=$OUT/summary.txt; : > $S
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 20 build-cuda/tests/backward_cuda_test --gtest_filter='CudaBackward.Linear*' > $OUT/linear.log 2>&1
echo "linear rc=$?" >> $S
grep -E "linear|PASSED|FAILED|Failure" $OUT/linear.log | head -30 >> $S
timeout 40 build-cuda/tests/backward_cuda_test > $OUT/all.log 2>&1
echo "all rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/all.log | tr '\n' ' ')" >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
