"""Start the real `decider serve` in a subprocess and talk to it like a client app: its
log, its metrics endpoint, its engine processes, its errors' google.rpc details."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from decider.bench import processes
from helpers.command import DECIDER


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

    def metric(self, name: str) -> float:
        """A metric summed over its labels, from the endpoint of a daemon started with
        --metrics-port 0 (its port is in the "serving" log line)."""
        serving = next(json.loads(line) for line in self.log().splitlines()
                       if '"event": "serving"' in line)
        url = f"http://127.0.0.1:{serving['metrics_port']}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        return sum(float(line.split()[-1]) for line in body.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    def children(self) -> list[int]:
        """The processes the daemon started: its engine and front-end processes and
        multiprocessing's resource tracker."""
        return processes.children(self.proc.pid)

    def engine_pids(self) -> list[int]:
        """The live engine processes (a killed one is a zombie until the daemon reaps it)."""
        return processes.roles(self.proc.pid)["engine"]

    def signal_all(self, sig: int) -> None:
        """`sig` to every process of the service, as systemd's stop sends SIGTERM
        (KillMode=control-group) and a terminal's Ctrl-C SIGINT."""
        for pid in (self.proc.pid, *self.children()):
            os.kill(pid, sig)

    def wait_engine(self, other_than: int | None = None, timeout: float = 120) -> int:
        """The pid of the one engine process, once it is not `other_than`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = [pid for pid in self.engine_pids() if pid != other_than]
            if len(pids) == 1:
                return pids[0]
            time.sleep(0.05)
        raise AssertionError(f"no engine process but {other_than}: {self.engine_pids()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Running, not a zombie nor gone."""
    return processes.name(pid) != ""


def error_details(e: grpc.RpcError):
    """(ErrorInfo, BadRequest) of a refused call; empty messages where it had none."""
    status = rpc_status.from_call(e)
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    for d in status.details if status is not None else ():
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
        elif d.Is(bad.DESCRIPTOR):
            d.Unpack(bad)
    return info, bad


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
        [*DECIDER, "serve", "--listen", address, *flags],
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
