#!/usr/bin/env bash
# The daemon under load on a CUDA machine with no network (issue 21's targets): random
# weights of gemma-3-270m's shape with its real tokenizer, `decider serve --engine triton`,
# then `decider bench --server` over gRPC and HTTP beside the engine's in-process rate.
#
#   bash scripts/gpu_daemon.sh TOKENIZER.gguf LLAMA_SDIST.tgz
#
# TOKENIZER.gguf: the model's tokenizer fields alone (the 270M's, 6 MB); the sdist:
# llama-cpp-python's source, built here for the CPU (its tokenizer only, ~2 min). Wheels
# in .whl/ as for scripts/gpu_run.sh, and what the service imports that a CUDA image lacks
# (`pip download --only-binary=:all: --python-version 3.12 -d .whl fastapi uvicorn
# httptools backports-zstd aiohttp msgspec pyzmq prometheus-client grpcio-health-checking
# grpcio-reflection grpcio-status jinja2 limits diskcache`). Results go to $OUT. Settings:
# CLIENTS, PER_CLIENT, PROCS (client processes), MAX_BATCH, MAX_QUEUE, FRONTENDS
# (front-end processes; past 1 the daemon listens on loopback TCP, LISTEN, which they
# share), DAEMON_CPUS and LOAD_CPUS (taskset lists: the daemon's processes on some cores,
# the load generator on others). A llama-cpp-python wheel beside the sdist (built for the
# CPU elsewhere: it is pure ctypes) is installed instead.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/gpu-out}
mkdir -p "$out"
tok=$(realpath "$1") sdist=$(realpath "$2")
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site "$here"/.whl/*.whl
pkg=/tmp/pkg
bash "$here/scripts/layout_package.sh" "$here" "$pkg"
export PYTHONPATH=$pkg:/tmp/site PYTHONUNBUFFERED=1
wheel=$(ls "$(dirname "$sdist")"/llama_cpp_python-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel"
elif ! python3 -c 'import llama_cpp' 2>/dev/null; then
  mkdir -p /tmp/llama && tar xzf "$sdist" -C /tmp/llama
  (cd /tmp/llama/llama_cpp_python-*/ && CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=off" \
    CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel -q --no-build-isolation --no-deps \
    -w /tmp/llama/wheel . > /tmp/llama/build.log 2>&1) || { tail -20 /tmp/llama/build.log; exit 1; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/llama/wheel/*.whl
fi
cd "$pkg"
model=/tmp/gemma-3-270m-random.gguf
python3 - "$model" "$tok" <<'EOF'
import sys
from pathlib import Path
import numpy as np
from decider.bench.random_gguf import SHAPES, write_tiny_gemma3
write_tiny_gemma3(Path(sys.argv[1]), np.random.default_rng(0), tokenizer_from=Path(sys.argv[2]),
                  **SHAPES["gemma-3-270m"])
EOF
export TRITON_CACHE_DIR=/tmp/triton-cache  # fresh: what compiles after READY shows there
rm -rf "$TRITON_CACHE_DIR"
compiled() { find "$TRITON_CACHE_DIR" -name "*.json" ! -name "__grp__*" | sort; }
frontends=${FRONTENDS:-1}
listen=${LISTEN:-$([ "$frontends" = 1 ] && echo unix:///tmp/decider.sock || echo 127.0.0.1:50051)}
pin_daemon=${DAEMON_CPUS:+taskset -c $DAEMON_CPUS}
pin_load=${LOAD_CPUS:+taskset -c $LOAD_CPUS}
$pin_daemon python3 -m decider serve --model "$model" --engine triton --listen "$listen" \
  --http 127.0.0.1:8080 --max-batch "${MAX_BATCH:-128}" --max-queue "${MAX_QUEUE:-4096}" \
  --frontends "$frontends" > "$out/daemon.log" 2>&1 &
daemon=$!
t0=$SECONDS
until python3 -m decider health "$listen" 2>/dev/null | grep -qx SERVING; do
  kill -0 $daemon 2>/dev/null || { tail -30 "$out/daemon.log"; exit 1; }
  sleep 0.5
done
echo "SERVING $((SECONDS - t0)) s after the start, $frontends front-end processes" \
  | tee "$out/bench_daemon.txt"
compiled > /tmp/compiled-at-ready
python3 - "$listen" <<'EOF' 2>&1 | tee -a "$out/bench_daemon.txt"
# the first calls after READY: none may pay a compilation
import asyncio, sys, time
import grpc
from decider.bench.daemon import requests
from decider.v1 import decider_pb2_grpc as pb_grpc
from decider.service.convert import request_to_proto
async def main():
    async with grpc.aio.insecure_channel(sys.argv[1]) as ch:
        stub = pb_grpc.DeciderStub(ch)
        for n in (1, 30, 128, 30):
            batch = [request_to_proto(r) for r in requests(120, n)]
            t0 = time.perf_counter()
            await asyncio.gather(*(stub.Decide(r, timeout=60) for r in batch))
            print(f"first calls after READY: {n} requests at once, {1000 * (time.perf_counter() - t0):.1f} ms")
asyncio.run(main())
EOF
$pin_load python3 -m decider bench "$model" --engine triton --server "$listen" \
  --clients "${CLIENTS:-1,64,256,1024}" --per-client "${PER_CLIENT:-40}" \
  --client-processes "${PROCS:-8}" --max-batch "${MAX_BATCH:-128}" --pid $daemon 2>&1 \
  | tee -a "$out/bench_daemon.txt" | tail -16
$pin_load python3 -m decider bench --server http://127.0.0.1:8080 --clients 1,64 \
  --per-client "${PER_CLIENT:-40}" --pid $daemon 2>&1 | tee "$out/bench_http.txt" | tail -10
compiled | comm -13 /tmp/compiled-at-ready - > /tmp/compiled-after-ready
xargs -r -n1 basename < /tmp/compiled-after-ready | sed 's/^/compiled after READY: /' \
  | tee -a "$out/bench_daemon.txt"
echo "Triton kernels compiled after READY: $(wc -l < /tmp/compiled-after-ready)" \
  | tee -a "$out/bench_daemon.txt"
kill -TERM $daemon; wait $daemon; echo "daemon exit $?" >> "$out/bench_daemon.txt"
tail -3 "$out/daemon.log" > "$out/daemon_tail.txt"
