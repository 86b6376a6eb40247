#!/bin/sh
# collect-libs.sh BINARY DEST: copies the shared libraries BINARY loads into DEST, except those the
# runtime base image brings itself (glibc, libstdc++ and libgcc_s: the build and runtime images are
# the same distribution release) and CUDA's (the CUDA runtime image, or the driver the NVIDIA
# container toolkit mounts). Fails when a library is not found, naming it.
set -eu
bin=$1
dest=$2
mkdir -p "$dest"
missing=$(ldd "$bin" | awk '/not found/ {print $1}' | grep -v '^libcuda\.so' || true)
if [ -n "$missing" ]; then
  echo "collect-libs.sh: $bin: libraries not found: $missing" >&2
  exit 1
fi
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libstdc++.so.* | \
      libgcc_s.so.* | libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | \
      libnvidia*) ;;
    *) cp -L "$lib" "$dest/" ;;
  esac
done
echo "collect-libs.sh: $(ls "$dest" | wc -l) libraries in $dest"
