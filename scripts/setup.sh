#!/usr/bin/env bash
# Create .venv with decider and its llama.cpp engine (CPU build). --test adds the test tools
# and the torch engines (triton, reference), with the CPU build of torch from constraints/.
#
# llama-cpp-python ships only as a source package: the first install compiles llama.cpp
# (about 8 minutes on 2 cores); pip's wheel cache keeps the result for later installs.
# GGML_NATIVE=OFF makes that cached wheel portable to any x86-64 host.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=llama
case "${1:-}" in
  --test) extras=llama,gpu,calibrate,test ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

say() { echo "setup: $*" >&2; }

say "creating .venv"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
llama=$(sed -n 's/.*"\(llama-cpp-python==[^"]*\)".*/\1/p' pyproject.toml)
if .venv/bin/python -m pip cache list --format=abspath "${llama/-cpp-python==/_cpp_python-}-*" \
    2>/dev/null | grep -q .; then
  building="$llama from pip's wheel cache"
else
  building="compiling $llama the first time: about 8-10 min on 2 cores"
fi

# pip is silent while it compiles: a line a minute says the install is still going
still_going() {
  local start=$SECONDS
  while sleep 60; do
    say "still installing, $(( (SECONDS - start) / 60 )) min ($building)"
  done
}

say "installing decider[$extras] ($building)"
still_going &
ticker=$!
trap 'kill "$ticker" 2>/dev/null' EXIT
.venv/bin/python -m pip install --quiet -c constraints/cpu.txt -e ".[$extras]"
if [ "$extras" != llama ]; then
  # Redocly's linter for the served OpenAPI document (tests/test_http_clients.py)
  if command -v npm >/dev/null; then
    say "installing @redocly/cli into .venv/redocly (npm)"
    npm install --prefix .venv/redocly --silent --no-audit --no-fund @redocly/cli@2.77.0 \
      >/dev/null || say "could not install @redocly/cli: its lint test will skip and say why"
  else
    say "no npm: the OpenAPI lint test will skip and say why"
  fi
fi
say "done: .venv/bin/decider (or '. .venv/bin/activate' to put decider on PATH)"
