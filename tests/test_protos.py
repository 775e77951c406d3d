"""The committed decider/v1 code is what protos/ generates (scripts/gen_protos.sh)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_generated_code_matches_the_proto(tmp_path):
    subprocess.run([str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True,
                   cwd=ROOT, env={**os.environ, "PYTHON": sys.executable})
    for name in ("decider_pb2.py", "decider_pb2.pyi", "decider_pb2_grpc.py"):
        fresh = (tmp_path / "decider" / "v1" / name).read_text()
        assert fresh == (ROOT / "decider" / "v1" / name).read_text(), (
            f"decider/v1/{name} is stale: run scripts/gen_protos.sh")
