#!/usr/bin/env bash
# llama-cpp-python built for CUDA (Hopper, sm_90) from its source archive, on a machine
# with no network, for the llama rows of `decider bench --engines` on the GPU.
#
#   bash scripts/gpu_llama.sh --trim SDIST.tar.gz OUT.tgz # here: the source, 7 MB of 94
#   bash scripts/gpu_llama.sh SDIST.tar.gz [WHEELS_DIR]   # there: starts the build, returns
#   bash scripts/gpu_llama.sh --install                   # there: waits for it, installs it
#
# The build (about five minutes on 16 cores, at low priority beside measurements) runs
# in its own process session, so the shell that started it may end. WHEELS_DIR holds
# wheels it needs that the machine lacks (diskcache). The install goes where
# scripts/gpu_run.sh puts the carried wheels.
set -euo pipefail
work=/tmp/llama-cuda
site=${SITE:-/tmp/site}
if [ "${1:-}" = --trim ]; then  # what a CUDA build never reads: it travels faster without
  tmp=$(mktemp -d)
  tar xzf "$2" -C "$tmp"
  src=$(ls -d "$tmp"/llama_cpp_python-*/)
  rm -rf "$src/.git" "$src"/vendor/llama.cpp/{docs,models,benches,media,tools/ui}
  for backend in rpc virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl; do
    rm -rf "$src/vendor/llama.cpp/ggml/src/ggml-$backend"
  done
  tar czf "$3" -C "$tmp" "$(basename "$src")"
  rm -rf "$tmp"
  exit
fi
if [ "${1:-}" = --install ]; then
  while [ ! -f "$work/done" ]; do sleep 5; done
  tail -3 "$work/build.log"
  if ! ls "$work"/wheel/llama_cpp_python-*.whl > /dev/null 2>&1; then
    echo "the build failed: $work/build.log" >&2
    exit 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$work"/wheel/*.whl
  exit
fi
rm -rf "$work" && mkdir -p "$work/wheel"
tar xzf "$1" -C "$work"
[ -n "${2:-}" ] && cp "$2"/*.whl "$work/wheel/"
src=$(ls -d "$work"/llama_cpp_python-*/)
cd "$src"
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off" \
  setsid nohup nice -n 19 bash -c "python3 -m pip wheel --no-build-isolation --no-deps -w '$work/wheel' . \
  > '$work/build.log' 2>&1; touch '$work/done'" < /dev/null > /dev/null 2>&1 &
echo "building llama-cpp-python for CUDA in $src (log: $work/build.log)"
