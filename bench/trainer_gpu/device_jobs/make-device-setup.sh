#!/bin/bash
# make-device-setup.sh [grpc]: recreates, in a fresh checkout, the ignored folders the device jobs
# carry (a new session's checkout has none of them): .device-deps/deps.tar.xz (the Debian build
# dependencies the lent machine lacks: Abseil, PCRE2, utf8proc, OpenBLAS), .device-clean/
# (device-env.sh and pack.sh from this folder), fixture tarballs .device-fx2/fixtures-models.tar.xz
# (deepseek_v3_s1, kimi_linear_s1, kimi_linear_b0, qwen3_next_b0) and .device-fx3/fixtures-more.tar.xz
# (fla_kda_s0, qwen3_next_s0, deepseek_v3_fp8), and with `grpc` .device-grpc/grpc.tar.xz (gRPC and
# protobuf for building loom-server there). Carry at most ~64 MiB with the tree: deps (14 MB), one
# fixture tarball (13-15 MB), a source snapshot (2.3 MB), grpc when needed. Needs apt-get (run as
# root) and the fixtures in ../shared/fixtures; ignores the folders in .git/info/exclude.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
here=bench/trainer_gpu/device_jobs
fx=${FIXTURES:-../shared/fixtures}
grep -qx '.device-\*/' .git/info/exclude 2>/dev/null || printf '.device-*/\n' >> .git/info/exclude

pack_debs() {  # pack_debs OUT.tar.xz package...
  local out=$1; shift
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$@" >/dev/null 2>&1)
  mkdir -p "$tmp/root"
  for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/root"; done
  mkdir -p "$(dirname "$out")"
  tar -C "$tmp/root" -cJf "$out" usr
  rm -rf "$tmp"
  ls -la "$out"
}

pack_debs .device-deps/deps.tar.xz libabsl-dev libabsl20220623 libpcre2-dev libpcre2-8-0 \
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 \
  libopenblas-pthread-dev libopenblas0-pthread libopenblas-dev libopenblas0 libgfortran5 \
  libquadmath0
if [ "${1:-}" = grpc ]; then
  pack_debs .device-grpc/grpc.tar.xz libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 \
    libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
    protobuf-compiler-grpc libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3 \
    zlib1g-dev
fi
mkdir -p .device-clean
cp "$here/device-env.sh" "$here/pack.sh" .device-clean/
mkdir -p .device-fx2 .device-fx3
tar -C "$fx" -cJf .device-fx2/fixtures-models.tar.xz deepseek_v3_s1 kimi_linear_s1 \
  kimi_linear_b0 qwen3_next_b0
tar -C "$fx" -cJf .device-fx3/fixtures-more.tar.xz fla_kda_s0 qwen3_next_s0 deepseek_v3_fp8
ls -la .device-fx2 .device-fx3
