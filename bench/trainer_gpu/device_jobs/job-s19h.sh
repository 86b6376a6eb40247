# Session 19, call H (the last ~4 minutes): the review fixes' CUDA side: gemm_cuda_test (the fused
# SwiGLU GEMV's predicate, the composition with one scratch tensor), cuda_kernels_test's norms
# (add_rmsnorm in place with a delta of another dtype), model_graphs_cuda_test (the shared
# expert's hidden buffer kept to the join). Carry as before; src s19h.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s19h} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
S=$OUT/summary.txt; : > $S
loom_configure || exit 1
loom_build gemm_cuda_test cuda_kernels_test model_graphs_cuda_test >> $S || exit 1
pass() { grep -E '^\[  (PASSED|FAILED)' $1 | tr '\n' ' '; }
for t in gemm_cuda_test model_graphs_cuda_test; do
  timeout 60 build-cuda/tests/$t > /tmp/$t.log 2>&1
  echo "$t rc=$? $(pass /tmp/$t.log)" >> $S; grep -E "^\[  FAILED|FAIL$" /tmp/$t.log | head -5 >> $S
done
timeout 40 build-cuda/tests/cuda_kernels_test --gtest_filter='*Norm*' > /tmp/k.log 2>&1
echo "norms rc=$? $(pass /tmp/k.log) fails $(grep -c 'FAIL$' /tmp/k.log)" >> $S
grep -E "add_rmsnorm_inplace_hf32_dbf16_D2304|FAIL$" /tmp/k.log | head -6 >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
