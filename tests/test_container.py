"""decider's container image (deploy/Containerfile, built by deploy/build_image.sh):
built offline on a local Debian base, it runs as a non-root user, exposes the gRPC and
HTTP ports, checks its health with `decider health`, and serves the embedded default
model with no network (loopback only) until SIGTERM, which it answers with exit 0.
tests/container/smoke.sh does the work and prints what it saw. Slow: the base image
(debootstrap) takes a few minutes the first time; podman keeps it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "container" / "smoke.sh"
TAG = "localhost/decider:test"


@pytest.mark.slow
def test_the_image_serves_the_embedded_model_without_network():
    if os.geteuid() != 0:
        pytest.skip("needs root: podman's storage, unshare and chroot")
    for tool in ("podman", "debootstrap", "unshare", "ip"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (Debian packages podman, debootstrap, "
                        "util-linux, iproute2; .ci/run installs them)")
    out = subprocess.run([str(SCRIPT), TAG], capture_output=True, text=True, timeout=1200)
    if out.returncode == 3:  # debootstrap could not reach Debian's packages
        pytest.skip(f"debootstrap could not build the base image: {out.stdout[-2000:]}")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    for seen in ("user=10001:10001", "50051/tcp", "8080/tcp",
                 "health=[CMD /opt/decider/.venv/bin/decider health 127.0.0.1:50051]",
                 "network: lo \n", "health: SERVING", '"event": "serving"', "stopped: exit 0"):
        assert seen in out.stdout, out.stdout
