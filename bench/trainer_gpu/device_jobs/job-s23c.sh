# Session 23, call C: racecheck of the fp8 wgmma MLA decode kernel with the raw ring on the
# bar.sync handoff too (LOOM_MLA_SYNC_HANDOFF=1: the producer warp and the widening warps meet
# once a slot use, as the P handoff does; racecheck does not model mbarriers), then the fp8 test
# on the default (mbarrier) path. Carry [".device-deps", ".device-clean"]; src s23c.
set -u
JOB_T0=$(date +%s)
source .device-clean/device-env.sh ${SRC:-s23c}
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
finish() { echo "total $(( $(date +%s) - JOB_T0 )) s" >> $S; tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R; }
trap finish EXIT
loom_configure || exit 1
loom_build kv_fp8_cuda_test >> $S || exit 1
T=build-cuda/tests
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
LOOM_MLA_SYNC_HANDOFF=1 timeout 120 $CS --tool racecheck --kernel-name kns=loom --error-exitcode 1 \
  $T/kv_fp8_cuda_test --gtest_filter=KvFp8Cuda.WgmmaRacecheckSmallSteps > $R/racecheck.log 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|GPUCHECK|PASSED|FAILED' $R/racecheck.log | head -6 | tr '\n' ' ')" >> $S
grep -E "Race reported" $R/racecheck.log | sort | uniq -c | head -5 >> $S
timeout 100 $T/kv_fp8_cuda_test > $R/kvfp8.log 2>&1
echo "kvfp8 rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/kvfp8.log | tr '\n' ' ')" >> $S
grep -E "^GPUCHECK.*wgmma" $R/kvfp8.log | head -8 >> $S
