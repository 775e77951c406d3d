"""Start the real `decider serve` in a subprocess and talk to it like a client app."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class Daemon:
    proc: subprocess.Popen
    address: str
    fault_file: Path
    log_file: Path

    def log(self) -> str:
        return self.log_file.read_text()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def health_status(address: str, timeout: float = 2.0, credentials=None) -> str:
    channel = (grpc.secure_channel(address, credentials) if credentials
               else grpc.insecure_channel(address))
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def spawn(tmp: Path, *flags: str, address: str | None = None, wait: bool = True,
          credentials=None, env: dict | None = None) -> Daemon:
    """`decider serve` on a unix socket in tmp (or `address`), fault hook armed."""
    address = address or f"unix://{tmp}/decider.sock"
    log_file = tmp / "daemon.log"
    fault = tmp / "fault"
    env = {**os.environ, "DECIDER_FAULT_FILE": str(fault), "PYTHONUNBUFFERED": "1",
           **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "decider.cli", "serve", "--listen", address, *flags],
        stdout=log_file.open("w"), stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(proc, address, fault, log_file)
    if wait:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited {proc.returncode}:\n{daemon.log()}")
            try:
                if health_status(address, credentials=credentials) == "SERVING":
                    return daemon
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        daemon.stop()
        raise RuntimeError(f"daemon never became SERVING:\n{daemon.log()}")
    return daemon
