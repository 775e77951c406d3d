"""The engine process: it owns the model and the device and runs the engine loop, so no
front end's Python work ever takes the GIL from it (docs/design.md, "The service": with
the engine in a thread of the gRPC process, 8% of its rate reached clients).

`engine_main` runs in the child (spawned, never forked: CUDA and llama.cpp threads do not
survive a fork). `EngineProcess` is the supervisor's handle on it: start, wait until it
is ready (loaded, hashed, warmed), stop (drain), kill, and its end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
from pathlib import Path

from ..config import Config
from ..errors import DeciderError, EngineFailure
from . import messages
from .messages import Failed, ModelFacts, Ping, Ready, Stop, WireError
from .process_names import ENGINE, name_this_process

EXIT_LOAD_REFUSED, EXIT_LOAD_FAILED = 2, 1


def load_model(cfg: Config):
    """Load, hash and warm the model the config names; returns the Decider."""
    from ..api import Decider
    from ..catalog import Catalog
    from ..questions import YesNo

    m, paths = cfg.model, cfg.paths
    if m.gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = m.gpu  # before any engine touches CUDA
    catalog = Catalog(user_file=Path(paths.catalog) if paths.catalog else None,
                      cache_dir=Path(paths.cache_dir) if paths.cache_dir else None)
    entry = catalog.get(m.name or catalog.default)  # locate never downloads
    options = {k: v for k, v in (("n_threads", m.threads), ("n_gpu_layers", m.gpu_layers),
                                 ("dtype", m.dtype)) if v}
    d = Decider(entry, engine=m.engine or None, n_ctx=m.n_ctx or None, limits=cfg.limits,
                catalog=catalog, calibration=m.calibration or None,
                prefix_cache_bytes=cfg.cache.budget(), **options)
    try:
        _ = d.model_sha256  # hashed before READY, not on the first request
        d.engine.warm_up(cfg.server.max_batch)
        d.decide("warm-up", [YesNo("Is this a warm-up?")])
    except BaseException:
        d.close()
        raise
    return d


def engine_main(cfg: Config, address: str, conn, heartbeat) -> None:
    """The engine process: load, report ready (or why not), serve until told to stop."""
    name_this_process(ENGINE)
    _obey_the_supervisor_only()
    import zmq

    from ..logs import configure
    from .engine_loop import EngineLoop
    from .metrics import Metrics

    configure(level=cfg.server.log_level, fmt=cfg.server.log_format, stream=sys.stdout)
    try:
        d = load_model(cfg)
    except DeciderError as e:
        conn.send_bytes(messages.encode(Failed(WireError.of(e))))
        sys.exit(EXIT_LOAD_REFUSED if e.kind in ("invalid", "not_found") else EXIT_LOAD_FAILED)
    except Exception as e:  # noqa: BLE001 - reported, then the process ends
        error = EngineFailure(f"loading failed: {type(e).__name__}: {e}")
        conn.send_bytes(messages.encode(Failed(WireError.of(error))))
        sys.exit(EXIT_LOAD_FAILED)
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.bind(address)
    conn.send_bytes(messages.encode(Ready(ModelFacts.of(d))))
    loop = EngineLoop(d.engine, max_batch=cfg.server.max_batch, max_queue=cfg.server.max_queue,
                      limits=cfg.limits, heartbeat=heartbeat, metrics=Metrics())
    code = loop.serve(sock, conn)
    sock.close()
    d.close()
    sys.exit(code)


def _obey_the_supervisor_only() -> None:
    """The supervisor alone stops the engine process, after the drain: systemd's stop
    signals every process of the service (KillMode=control-group), Ctrl-C the terminal's
    process group. And it never outlives the supervisor: on Linux the kernel kills it
    when the supervisor dies (say, SIGABRT from a withheld watchdog)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class EngineProcess:
    """One engine process, seen from the supervisor's event loop."""

    def __init__(self, cfg: Config, address: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.address = address
        self.heartbeat = ctx.Value("d", 0.0, lock=False)  # EngineLoop.heartbeat
        self.ended_by: DeciderError | None = None  # why the supervisor killed it, if it did
        self._pinged_at = 0.0
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=engine_main, args=(cfg, address, child,
                                                             self.heartbeat),
                                   name="decider-engine", daemon=True)
        self.process.start()
        child.close()
        loop = asyncio.get_running_loop()
        self.ended = loop.create_future()  # the exit code, once the process is gone
        self._ready = loop.create_future()
        loop.add_reader(self.process.sentinel, self._on_exit)
        loop.add_reader(self._conn.fileno(), self._on_message)

    async def ready(self) -> ModelFacts:
        """The model's facts once loaded and warmed; raises what stopped it otherwise."""
        return await self._ready

    def silence(self, now: float) -> float:
        """Seconds the engine loop has left its supervisor's ping unanswered (0 once it
        beat after the ping); a new ping goes out whenever the last one was answered, so
        at most one waits in the pipe. The loop beats between calls and at every chunk of
        a call, so a long call that progresses is never silent for long."""
        if not self._ready.done() or self.ended.done():
            return 0.0
        if self.heartbeat.value >= self._pinged_at:
            self._pinged_at = now
            self._send(Ping())
            return 0.0
        return now - self._pinged_at

    def stop(self) -> None:
        """Finish every accepted request, then exit."""
        self._send(Stop())

    def kill(self, why: DeciderError | None = None) -> None:
        """SIGKILL (it ignores SIGTERM); `why` is what its requests are refused with."""
        self.ended_by = self.ended_by or why
        if self.process.is_alive():
            self.process.kill()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def _send(self, message: Ping | Stop) -> None:
        if not self.ended.done():
            try:
                self._conn.send_bytes(messages.encode(message))
            except OSError:  # it died and _on_exit has not run yet: that tells the end
                pass

    def _on_message(self) -> None:
        try:
            message = messages.control(self._conn.recv_bytes())
        except (EOFError, OSError):  # the process is going: _on_exit tells why
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            return
        if not self._ready.done():
            if isinstance(message, Ready):
                self._ready.set_result(message.facts)
            else:
                self._ready.set_exception(message.error.error())

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.process.sentinel)
        self.process.join()
        code = self.process.exitcode
        if not self._ready.done():
            self._ready.set_exception(EngineFailure(
                f"the engine process exited with code {code} while loading", exit_code=code))
        if not self.ended.done():
            self.ended.set_result(code)
