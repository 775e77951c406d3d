"""The real daemon for tests: decider.service.daemon.Daemon, with its engine process (spawned, the
real gemma-3-270m on llama.cpp), its gRPC listener on a unix socket and its HTTP listener,
run in an event loop of its own thread, so that a test talks to it with blocking clients
(TypeSafe's SDK, httpx2, gRPC stubs, raw sockets) as an application would.

While one runs, this process is set up as `decider serve` sets itself up: prometheus_client
in multiprocess mode over a private directory (the engine process's counters reach
/metrics only that way), and the engine fault hook armed on `fault_file` (the engine
process reads DECIDER_FAULT_FILE from the environment it was spawned with). Both are
process-wide, so one DaemonThread runs at a time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from prometheus_client import values

from decider.config import (
    Config,
    HttpSection,
    ModelSection,
    PathsSection,
    ServerSection,
)
from decider.service.daemon import Daemon

KEY = "test-key-0123456789abcdef"  # what clients send
MODEL = "gemma-3-270m"
N_CTX = 2048  # the window of conftest's in-process `decider`: answers compare with its own
FAULT, METRICS = "DECIDER_FAULT_FILE", "PROMETHEUS_MULTIPROC_DIR"


class DaemonThread:
    running: DaemonThread | None = None

    def __init__(self, cache_dir: Path, http: HttpSection | None = None, *,
                 server: ServerSection | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="decider-test-"))
        self.grpc_address = f"unix://{self.tmp}/grpc.sock"
        self.fault_file = self.tmp / "fault"
        self.cfg = Config(
            server=replace(server or ServerSection(), listen=(self.grpc_address,)),
            http=http or HttpSection(address="127.0.0.1:0", api_keys=(KEY,)),
            model=ModelSection(name=MODEL, engine="llama", n_ctx=N_CTX),
            paths=PathsSection(cache_dir=str(cache_dir)), source="DaemonThread")
        self._started: concurrent.futures.Future = concurrent.futures.Future()

    def __enter__(self) -> DaemonThread:
        if DaemonThread.running is not None:
            raise RuntimeError("one DaemonThread at a time: its metrics and fault hook are "
                               "the process's")
        DaemonThread.running = self
        self._saved_env = {k: os.environ.get(k) for k in (FAULT, METRICS)}
        self._saved_values = values.ValueClass
        os.environ[FAULT] = str(self.fault_file)
        os.environ[METRICS] = str(self.tmp / "metrics")
        (self.tmp / "metrics").mkdir()
        values.ValueClass = values.MultiProcessValue()  # before the daemon's metrics exist
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        try:
            self.daemon: Daemon = self._started.result(300)
        except BaseException:
            self.__exit__()
            raise
        self.url = self.daemon.http.url if self.daemon.http else None
        return self

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        daemon = None
        try:
            daemon = Daemon(self.cfg)
            await daemon.start()
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread
            self._started.set_exception(e)
        else:
            self._started.set_result(daemon)
            await self._stop.wait()
        finally:
            if daemon is not None:
                await daemon.stop()

    def __exit__(self, *exc) -> None:
        if self._started.done() and self._started.exception() is None:  # it serves
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        values.close_all_multiprocess_files()
        values.ValueClass = self._saved_values
        for key, value in self._saved_env.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
        shutil.rmtree(self.tmp, ignore_errors=True)
        DaemonThread.running = None
