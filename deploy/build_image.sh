#!/usr/bin/env bash
# Build decider's container image with podman (or buildah's `bud`), offline at build
# time: the wheels of decider[llama] gathered here (pip's cache, PyPI), then
# `podman build` of deploy/Containerfile on them.
#   deploy/build_image.sh [TAG] [BASE]
# TAG: localhost/decider:VERSION by default. BASE: the base image (default Debian's
# bookworm-slim from its registry); `--local-base` makes one with debootstrap and
# imports it (localhost/decider-base:bookworm), for hosts that reach Debian's packages
# but no image registry.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/pyproject.toml")
tag=${1:-localhost/decider:$version}
base=${2:-docker.io/library/debian:bookworm-slim}
py=${PYTHON:-$here/.venv/bin/python}
say() { echo "build_image: $*" >&2; }

if [ "$base" = --local-base ]; then
  base=localhost/decider-base:bookworm
  if ! podman image exists "$base"; then
    say "debootstrap bookworm (minbase, python3) and import it as $base"
    root=$(mktemp -d)
    debootstrap --variant=minbase --include=python3,python3-venv,libgomp1 bookworm \
      "$root" > "$root.log" 2>&1 || { tail -20 "$root.log"; exit 3; }
    tar -C "$root" -c . | podman import - "$base" > /dev/null
    rm -rf "$root" "$root.log"
  fi
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
say "wheels of decider[llama] (llama.cpp compiled once if pip's cache lacks it)"
"$py" -m pip wheel -q --no-deps -w "$ctx/wheels" "$here"
CMAKE_ARGS=-DGGML_NATIVE=OFF "$py" -m pip wheel -q -w "$ctx/wheels" \
  "$(ls "$ctx"/wheels/decider_daemon-*.whl)[llama]"
cp "$here/deploy/Containerfile" "$ctx/"
cp "$here/deploy/container.toml" "$ctx/decider.toml"
say "podman build $tag on $base"
podman build -q --format docker ${ISOLATION:+--isolation "$ISOLATION"} --build-arg BASE="$base" -t "$tag" "$ctx"
