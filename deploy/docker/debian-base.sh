#!/bin/sh
# debian-base.sh [TAG]: a Debian bookworm base image made with debootstrap from Debian's mirror and
# imported into podman, for machines that reach Debian's packages but no container registry.
# Then: podman build --build-arg BASE=TAG ... (docs/deploy.md). Needs root, debootstrap, podman.
set -eu
tag=${1:-localhost/debian:bookworm-debootstrap}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror"
# The image's apt must reach the same mirror, the security updates too.
cat > "$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$tag"
echo "debian-base.sh: $tag"
