#!/usr/bin/env bash
# The package laid out for import without installing, as setuptools' package-dir maps
# it: decider/, with engines/ and kernels/ inside; scripts/ and tests/ beside it. No
# kernels/ beside it: a directory of that name first on sys.path would shadow the
# `kernels` package that transformers imports.
#
#   bash scripts/layout_package.sh SRC DEST       # a checkout's files
#   bash scripts/layout_package.sh --rev REV OUT.tgz  # a commit's, as a tarball to carry
set -euo pipefail
if [ "$1" = --rev ]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  tmp=$(mktemp -d)
  git -C "$here" archive "$2" | tar x -C "$tmp/"
  bash "$0" "$tmp" "$tmp/pkg"
  tar czf "$3" -C "$tmp/pkg" .
  rm -rf "$tmp"
  exit
fi
src=$1 dest=$2
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$src/decider" "$dest/" && cp -r "$src/engines" "$dest/decider/engines"
cp -r "$src/kernels" "$dest/decider/kernels"
cp -r "$src/tests" "$src/scripts" "$dest/"
