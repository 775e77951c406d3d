"""`decider serve`: the daemon's life. It starts the engine process and serves once that is
loaded and warmed (health SERVING, READY=1); while no engine answers it is NOT_SERVING and
refuses with UNAVAILABLE; an engine that fails or dies is replaced (a new one that dies
before answering anything, or cannot load, ends the daemon with exit code 1 for systemd
to restart); SIGHUP loads a changed model in a second engine process while the first
serves, then swaps; SIGTERM drains. systemd sees one service: this process."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from .config import Config
from .engine_loop import EXIT_ENGINE_FAILED
from .engine_process import EngineProcess
from .errors import EngineDied
from .frontend import Served
from .frontend_worker import FrontendWorker
from .listeners import check_listeners
from .logs import configure
from .metrics import Metrics, process_ended
from .serving import Servers
from .systemd import Notifier

log = structlog.get_logger("decider.server")


class Daemon:
    def __init__(self, cfg: Config, reread: Callable[[], Config] | None = None) -> None:
        self.cfg = cfg
        self._reread = reread  # SIGHUP: the config as the file says now
        self.notifier = Notifier()
        self.metrics = Metrics()
        self.servers = Servers(cfg, self.metrics)
        self.frontend = self.servers.frontend
        self.workers: list[FrontendWorker] = []  # the extra front-end processes
        self.engine: EngineProcess | None = None
        self.down_since: float | None = time.monotonic()  # no engine answering since
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._run_dir = Path(tempfile.mkdtemp(prefix="decider-"))  # 0700: engine sockets
        self._generation = 0
        self._stopping = False
        self._tasks: list[asyncio.Task] = []

    # -- start ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.servers.set_health(False)
        check_listeners(self.cfg)
        self.notifier.status("loading the model")
        self.engine, self.frontend.current = await self._start_engine(self.cfg)
        self._engine_up()
        await self.servers.start()
        self.workers = [FrontendWorker(self.cfg) for _ in range(self.cfg.server.frontends - 1)]
        self._tasks += [asyncio.create_task(self._watch_worker(w)) for w in self.workers]
        self._announce(self.cfg.limits)
        metrics_port = None
        if self.cfg.server.metrics_port is not None:
            metrics_port = self.metrics.serve(self.cfg.server.metrics_port)
        await self.servers.set_health(True)
        if self.notifier.watchdog_seconds:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        facts = self.frontend.current.facts
        self.notifier.ready(f"serving {facts.name} on {', '.join(self.cfg.server.listen)}")
        log.info("serving", listen=list(self.cfg.server.listen),
                 http=self.http.url if self.http else None, model=facts.name,
                 engine=facts.engine, n_ctx=facts.info.n_ctx, sha256=facts.sha256,
                 metrics_port=metrics_port, config=self.cfg.source)

    async def _start_engine(self, cfg: Config) -> tuple[EngineProcess, Served]:
        """A new engine process, loaded and warmed, and the front end's view of it."""
        self._generation += 1
        address = f"ipc://{self._run_dir}/engine-{self._generation}.sock"
        engine = EngineProcess(cfg, address)
        try:
            facts = await engine.ready()
            served = Served.open(facts, address, cfg.limits)
        except BaseException:
            engine.kill()
            raise
        self._tasks.append(asyncio.create_task(self._watch(engine, served)))
        return engine, served

    def _engine_up(self) -> None:
        self.down_since = None
        self.metrics.engine_up.set(1)

    @property
    def http(self):
        return self.servers.http

    def _announce(self, limits) -> None:
        """Tell the other front-end processes which engine process serves now."""
        self._tell_workers("serve", self.frontend.current.facts, self.engine.address, limits)

    def _tell_workers(self, *message) -> None:
        for worker in self.workers:
            worker.send(*message)

    # -- an engine's end ----------------------------------------------------------------

    async def _watch(self, engine: EngineProcess, served: Served) -> None:
        """When this engine process ends: if it is the one serving and we are not
        stopping, every request it held is refused and a new one takes its place."""
        code = await engine.ended
        process_ended(engine.pid)
        answered = served.client.answered
        served.client.fail_all(EngineDied(code))
        await served.client.close()
        if engine is not self.engine or self._stopping:
            return
        self._tell_workers("down", EngineDied(code))
        self.frontend.current = None
        self.down_since = time.monotonic()
        self.metrics.engine_up.set(0)
        await self.servers.set_health(False)
        reason = "an engine failure" if code == EXIT_ENGINE_FAILED else f"exit code {code}"
        log.error("reloading the model after an engine failure", exit_code=code,
                  signal=_signal_name(code), answered=answered)
        self.notifier.status(f"reloading after {reason}")
        if not answered:
            return self._give_up("the engine process ended before answering anything")
        try:
            self.engine, self.frontend.current = await self._start_engine(self.cfg)
        except Exception as e:  # noqa: BLE001 - systemd restarts the whole service
            return self._give_up("reload failed", error=str(e))
        self._announce(self.cfg.limits)
        self._engine_up()
        await self.servers.set_health(True)
        self.notifier.status(f"serving {self.frontend.current.facts.name}")
        log.info("reloaded")

    async def _watch_worker(self, worker: FrontendWorker) -> None:
        """A front-end process that ends unasked ends the service: systemd restarts it
        whole, so that its share of the listeners comes back."""
        code = await worker.ended
        if not self._stopping:
            self._give_up("a front-end process ended", pid=worker.process.pid, exit_code=code)

    def _give_up(self, why: str, **fields) -> None:
        log.critical(f"{why}; exiting for the service manager to restart", **fields)
        self.exit_code = 1
        self.stopped.set()

    # -- SIGHUP -------------------------------------------------------------------------

    async def reload_config(self) -> None:
        """Apply what changed: a changed model (or engine setting) is loaded in a new
        engine process while the running one serves; a bad config keeps the running one."""
        self.notifier.reloading()
        try:
            new = self._reread() if self._reread else self.cfg
            check_listeners(new)
            engine_side = (new.model, new.paths, new.limits, new.server.max_batch,
                           new.server.max_queue)
            if engine_side != (self.cfg.model, self.cfg.paths, self.cfg.limits,
                               self.cfg.server.max_batch, self.cfg.server.max_queue):
                self.notifier.status("loading the new model")
                old = self.engine
                self.engine, self.frontend.current = await self._start_engine(new)
                self._announce(new.limits)
                old.stop()  # it answers what it holds, then exits
            if (new.server.listen, new.tls, new.server.frontends) != (
                    self.cfg.server.listen, self.cfg.tls, self.cfg.server.frontends):
                log.warning("listeners, TLS and front-end processes change only on restart",
                            listen=new.server.listen)
            self.frontend.max_queue, self.frontend.limits = new.server.max_queue, new.limits
            configure(level=new.server.log_level, fmt=new.server.log_format, stream=sys.stdout)
            self.cfg = new
            log.info("configuration reloaded", config=new.source)
        except Exception as e:  # noqa: BLE001 - keep serving with what runs now
            log.error("reload refused; the running configuration stays", error=str(e))
        self.notifier.ready(f"serving {self.frontend.current.facts.name}")

    # -- watchdog, health -----------------------------------------------------------------

    async def _watchdog(self) -> None:
        """WATCHDOG=1 at half the period, unless an engine call has run past its limit or
        no engine has answered for that long: then systemd restarts the service."""
        limit = self.cfg.server.engine_call_limit_seconds
        while True:
            now = time.monotonic()
            busy = self.engine.busy.value if self.engine else 0.0
            stalled = now - busy if busy else now - self.down_since if self.down_since else 0
            if stalled < limit:
                self.notifier.watchdog()
            else:
                log.error("no engine progress past its limit; withholding the watchdog",
                          seconds=round(stalled, 1), limit=limit)
            await asyncio.sleep(self.notifier.watchdog_seconds / 2)

    # -- stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Drain: NOT_SERVING, new requests UNAVAILABLE, accepted ones answered within the
        grace; what cannot finish in it is refused as the server stopping (retryable)."""
        self._stopping = True
        self.notifier.stopping()
        grace = self.cfg.server.grace_seconds
        self._tell_workers("stop")  # they drain beside this process
        await self.servers.drain(grace)
        await self.servers.close()
        await asyncio.gather(*(w.stop(grace + 5) for w in self.workers))
        if self.engine:
            self.engine.stop()
            try:
                await asyncio.wait_for(asyncio.shield(self.engine.ended), 10)
            except TimeoutError:
                self.engine.kill()
        for task in self._tasks:
            task.cancel()
        shutil.rmtree(self._run_dir, ignore_errors=True)


def _signal_name(code: int | None) -> str:
    return signal.Signals(-code).name if code is not None and code < 0 else ""


async def serve(cfg: Config, reread: Callable[[], Config] | None = None) -> int:
    daemon = Daemon(cfg, reread)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopped.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(daemon.reload_config()))
    try:
        await daemon.start()
        await daemon.stopped.wait()
        log.info("stopping", grace_s=cfg.server.grace_seconds)
    finally:
        await daemon.stop()
    return daemon.exit_code
