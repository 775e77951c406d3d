#!/usr/bin/env bash
# Regenerate decider/v1/*_pb2*.py from protos/ (grpcio-tools, pinned in the test extra
# to the grpcio runtime). tests/test_protos.py fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
"${PYTHON:-python}" -m grpc_tools.protoc -Iprotos --python_out="$out" --pyi_out="$out" \
    --grpc_python_out="$out" protos/decider/v1/decider.proto
