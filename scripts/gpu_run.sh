#!/usr/bin/env bash
# One call on a CUDA machine with no network: wheels carried in .whl/, the package laid
# out for import without installing, then the GPU tests and the benchmarks.
# Results go to $OUT (default ./gpu-out). Settings (environment): TESTS (paths, or none),
# K (pytest -k), KERNELS=0/1/parts (tile sweep), PROFILE=0/1 (PROFILE_SHAPE: a shape
# other than the 270M's), BASE (A/B against commits' packages; ROUNDS of it), SHAPES
# (random weights of real shapes; none: no benchmark), MODELS (catalog models' own
# files), ENGINES, N_CTX, REPEAT, BENCH_ARGS (more flags of `decider bench`; BASE's runs
# take them too), LLAMA_SDIST (a trimmed llama-cpp-python source, scripts/gpu_llama.sh:
# built for CUDA beside the tests, then installed before the benchmarks).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/gpu-out}
mkdir -p "$out"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site "$here"/.whl/*.whl
pkg=/tmp/pkg
bash "$here/scripts/layout_package.sh" "$here" "$pkg"
export PYTHONPATH=$pkg:/tmp/site PYTHONUNBUFFERED=1
[ -n "${LLAMA_SDIST:-}" ] && bash "$here/scripts/gpu_llama.sh" "$LLAMA_SDIST" "$here/.whl"
# llama.cpp's CUDA build (scripts/gpu_llama.sh) segfaults at load in a process that
# imported numpy first, as decider's do, unless its library is preloaded
case ${ENGINES:-} in *llama*) [ -f /tmp/site/llama_cpp/lib/libllama.so ] &&
  export LD_PRELOAD=/tmp/site/llama_cpp/lib/libllama.so ;; esac
cd "$pkg"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton, transformers, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__)'
} 2>&1 | tee "$out/machine.txt"
# (the import-time test needs the service's packages, which this machine lacks)
if [ "${TESTS:-}" != none ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" -k "${K:-not imports_torch}" -rs \
    ${TESTS:-tests/gpu tests/test_kernels.py tests/test_passes.py tests/test_triton_engine.py tests/test_gguf_weights.py} \
    2>&1 | tee "$out/tests.txt" | tail -25
fi
if [ "${KERNELS:-1}" != 0 ]; then  # 1: every part, else the parts named
  python3 scripts/bench_kernels.py $([ "${KERNELS:-1}" = 1 ] || echo "$KERNELS") 2>&1 \
    | tee "$out/bench_kernels.txt" | tail -60
fi
if [ "${PROFILE:-1}" = 1 ]; then
  TRACE_DIR=$out python3 scripts/profile_engine.py ${PROFILE_SHAPE:-} 2>&1 \
    | tee "$out/profile_engine.txt" | tail -30
fi
bench_in() {  # $1: a package's directory; the rest: what picks the weights
  local side=$1
  shift
  (cd "$side" && PYTHONPATH=$side:/tmp/site python3 -m decider bench "$@" \
    --engines "${ENGINES:-triton,reference:bfloat16}" --n-ctx "${N_CTX:-32768}" \
    --repeat "${REPEAT:-10}" ${BENCH_ARGS:-} 2>&1)
}
if [ -n "${BASE:-}" ]; then  # A/B on one machine: BASE is one or more commits' packages,
  # made here by `scripts/layout_package.sh --rev REV .carry/NAME.tgz` and carried; the
  # runs of each of SHAPES alternate with this checkout's, ROUNDS times (instead of the
  # benchmarks below)
  sides=()
  for tgz in $BASE; do
    mkdir -p "/tmp/ab/$tgz" && tar xzf "$here/$tgz" -C "/tmp/ab/$tgz" && sides+=("/tmp/ab/$tgz")
  done
  sides+=("$pkg")
  for shape in ${SHAPES:-gemma-3-270m}; do
    for round in $(seq "${ROUNDS:-2}"); do
      for side in "${sides[@]}"; do
        echo "== $shape, $([ "$side" = "$pkg" ] && echo this checkout || echo "${side#/tmp/ab/}"), round $round"
        bench_in "$side" --shape "$shape" | tail -4
      done
    done
  done | tee "$out/ab.txt"
  exit
fi
if [ -n "${LLAMA_SDIST:-}" ]; then  # waits for the build at most LLAMA_WAIT seconds
  timeout "${LLAMA_WAIT:-420}" bash "$here/scripts/gpu_llama.sh" --install 2>&1 \
    | tee "$out/llama_build.txt"
  [ -f /tmp/site/llama_cpp/lib/libllama.so ] && export LD_PRELOAD=/tmp/site/llama_cpp/lib/libllama.so
fi
for shape in ${SHAPES:-gemma-3-270m}; do
  [ "$shape" = none ] && continue
  bench_in "$pkg" --shape "$shape" | tee "$out/bench_engines_$shape.txt" | tail -8
done
for model in ${MODELS:-}; do
  bench_in "$pkg" "$model" | tee "$out/bench_engines_model_$model.txt" | tail -8
done
