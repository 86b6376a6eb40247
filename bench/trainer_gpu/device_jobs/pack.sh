#!/bin/bash
# pack.sh NAME [files...]: HEAD plus the listed working-tree files into .device-clean/src-NAME.tar.xz
set -e
cd "$(git rev-parse --show-toplevel)"
name=$1; shift
tmp=$(mktemp -d)
git archive HEAD | tar -C $tmp -x --exclude=weights/default/model.safetensors
for f in "$@"; do mkdir -p $tmp/$(dirname $f); cp -a $f $tmp/$f; done
echo "$(git rev-parse --short HEAD)${*:+ + $*}" > $tmp/.loom-src-rev
tar -C $tmp -cJf .device-clean/src-$name.tar.xz .
rm -rf $tmp
ls -la .device-clean/src-$name.tar.xz
