# Session 19, call F: why moe_route takes ~12 us for one token (one warp): the SASS of
# route_kernel<true> (instruction mix, calls) and ncu's source counters (hot instructions) for one
# decode-sized call (moe_cuda_bench decode). Carry as before; src s19e.
set -u
source .device-clean/device-env.sh ${SRC:-s19e} fixtures-train.tar.xz
R=$OUT/r; mkdir -p $R; S=$OUT/summary.txt; : > $S
trap 'tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $R' EXIT
nvcc -std=c++20 -arch=sm_90a -O3 -lineinfo --expt-relaxed-constexpr -I. -cubin -o /tmp/moe.cubin \
  kernels/cuda/moe.cu > $R/nvcc.log 2>&1; echo "nvcc rc=$?" >> $S
cuobjdump -sass /tmp/moe.cubin > $R/moe.sass 2>&1
awk '/Function : .*route_kernelILb1E/{p=1;next} /Function :/{p=0} p' $R/moe.sass > $R/route.sass
echo "route sass lines $(wc -l < $R/route.sass); CALL $(grep -c CALL $R/route.sass); DFMA $(grep -c DFMA $R/route.sass); LDL/STL $(grep -cE 'LDL|STL' $R/route.sass); BRA $(grep -c BRA $R/route.sass); MUFU $(grep -c MUFU $R/route.sass)" >> $S
loom_configure > /dev/null 2>&1 || exit 1
loom_build moe_cuda_bench >> $S || exit 1
timeout 120 ncu --clock-control none --kernel-name regex:route_kernel --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section InstructionStats \
  build-cuda/bin/moe_cuda_bench decode > $R/ncu-route.txt 2>&1
echo "ncu rc=$?" >> $S
grep -E "Executed Instructions|Warp Cycles|Stall|stall" $R/ncu-route.txt | head -20 >> $S
