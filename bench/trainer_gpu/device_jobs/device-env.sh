# source .device-clean/device-env.sh NAME [fixtures-tarball]
# Unpacks deps, the source snapshot src-NAME.tar.xz into /tmp/src, fixtures into /tmp/fx,
# and defines loom_configure / loom_build. Leaves cwd at /tmp/src.
R=$PWD
NAME=$1
dd=/tmp/loom-device-deps
if [ ! -d $dd/usr ]; then mkdir -p $dd && tar -C $dd -xJf $R/.device-deps/deps.tar.xz; fi
lib=$dd/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$dd/usr
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread
command -v pkg-config >/dev/null || export PATH=$dd/usr/bin:$PATH
export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$dd/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$dd
export CMAKE_POLICY_VERSION_MINIMUM=3.5
mkdir -p /tmp/src && tar -C /tmp/src -xJf $R/.device-clean/src-$NAME.tar.xz
if [ -n "${2:-}" ]; then mkdir -p /tmp/fx && tar -C /tmp/fx -xJf $R/.device-fx/$2; fi
cd /tmp/src
echo "src: $(cat .loom-src-rev)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
loom_configure() {
  cmake --preset cuda -DLOOM_BENCH=ON -DLOOM_FIXTURES_DIR=/tmp/fx \
    -DLOOM_OPENBLAS_LIB=$lib/openblas-pthread/libopenblas.so \
    -DLOOM_CBLAS_INCLUDE=$dd/usr/include/x86_64-linux-gnu/openblas-pthread "$@" > $OUT/configure.log 2>&1 \
    || { tail -30 $OUT/configure.log; return 1; }
}
loom_build() {
  local t0=$(date +%s)
  cmake --build build-cuda -j 16 --target "$@" > $OUT/build.log 2>&1 \
    || { grep -E "error|Error" $OUT/build.log | head -30; return 1; }
  echo "build $* : $(( $(date +%s) - t0 )) s"
}
