# Session 18, call D: the session's end state on the 48B-shaped model: loom-bench offline at batch
# 1, 8 and 64 over 4096-token contexts (TPOT, device time a decode step, idle gap between decode
# steps) and 8192 / 32768-token prefill; cuda_kernels_test and model_graphs_cuda_test whole.
# Carry [".device-deps", ".device-clean", ".device-fx"]; src s18d.
set -u
JOB_T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - JOB_T0) )); }
source .device-clean/device-env.sh ${SRC:-s18d} fixtures-train.tar.xz
export LOOM_GPU_FIXTURES=/tmp/fx
loom_configure || exit 1
loom_build cuda_kernels_test model_graphs_cuda_test loom-bench || exit 1
S=$OUT/summary.txt; : > $S
echo "src $(cat .loom-src-rev); after build $(( $(date +%s) - JOB_T0 )) s" >> $S
timeout 60 build-cuda/tests/cuda_kernels_test > $OUT/kernels.log 2>&1
echo "kernels rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/kernels.log | tr '\n' ' ')" >> $S
grep -c "GPUCHECK.*PASS" $OUT/kernels.log >> $S; grep "GPUCHECK.*FAIL" $OUT/kernels.log | head >> $S
timeout 60 build-cuda/tests/model_graphs_cuda_test > $OUT/graphs.log 2>&1
echo "graphs rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/graphs.log | tr '\n' ' ')" >> $S
timeout $(( $(left) - 5 )) build-cuda/bin/loom-bench offline --device cuda \
  --model bench/configs/kimi_linear_48b_a3b --random_weights 1 --context 4096 --batches 1,8,64 \
  --decode_steps 32 --prefill 8192,32768 --json $OUT/offline.json > $OUT/offline.md 2>&1
echo "offline rc=$?" >> $S; cat $OUT/offline.md >> $S
echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S
