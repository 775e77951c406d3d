"""`decider serve`: the daemon's life, one state machine in this module.

    starting     the first engine process loads; health NOT_SERVING
    serving      an engine answers; health SERVING, READY=1
    reloading    SIGHUP changed the model: a second engine loads while the first serves
    engine down  the serving engine ended or hung: its requests were refused at once
                 (UNAVAILABLE), a replacement loads; health NOT_SERVING
    draining     SIGTERM/SIGINT: new requests refused, accepted ones answered within the
                 grace, then every process stops

Whatever starts or swaps an engine runs in one task, `_supervise`, one thing at a time:
SIGHUPs in quick succession are coalesced into reloads in turn (never two engines loading
side by side), an engine's end while a reload loads is settled by that reload. Every
engine process ever started is tracked until it is gone, so a stop leaves none behind.
An engine silent past `engine_call_limit_seconds` is hung (liveness.py): killed, and
replaced like a dead one. A replacement that cannot load, or more than MAX_REPLACEMENTS
within REPLACEMENT_WINDOW seconds, ends the daemon with exit code 1 for systemd to
restart. The listeners are bound before the first load, so health answers (NOT_SERVING)
while it loads, and nothing that loads runs on the event loop. systemd sees one service:
this process."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from ..config import Config
from ..errors import EngineDied
from ..logs import configure
from .engine_loop import EXIT_ENGINE_FAILED
from .engine_process import EngineProcess
from .frontend import ServedModel
from .listeners import check_listeners, claim_addresses
from .liveness import feed_the_watchdog, kill_the_hung
from .messages import Down, Serve, Stop, WireError
from .metrics import Metrics, process_ended
from .servers import Servers
from .systemd import Notifier
from .workers import FrontendWorker

log = structlog.get_logger("decider.server")

MAX_REPLACEMENTS, REPLACEMENT_WINDOW = 3, 60.0  # engines replaced in a row before giving up


class Life(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    RELOADING = "reloading"
    ENGINE_DOWN = "engine down"
    DRAINING = "draining"


def _engine_side(cfg: Config) -> tuple:
    """What an engine process is started with: a change needs a new one."""
    return (cfg.model, cfg.paths, cfg.limits, cfg.cache, cfg.server.max_batch,
            cfg.server.max_queue)


class Daemon:
    def __init__(self, cfg: Config, reread: Callable[[], Config] | None = None) -> None:
        self.cfg = cfg
        self._reread = reread  # SIGHUP: the config as the file says now
        self.life = Life.STARTING
        self.notifier = Notifier()
        self.metrics = Metrics()
        self.servers = Servers(cfg, self.metrics)
        self.frontend = self.servers.frontend
        self.workers: list[FrontendWorker] = []  # the extra front-end processes
        self.engine: EngineProcess | None = None  # the serving one
        self.engines: set[EngineProcess] = set()  # every one not yet gone
        self.down_since: float | None = time.monotonic()  # no engine answering since
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._run_dir = Path(tempfile.mkdtemp(prefix="decider-"))  # 0700: engine sockets
        self._generation = 0
        self._claims = []
        self._wake = asyncio.Event()  # the supervisor has something to do
        self._reload_asked = False
        self._replaced: list[float] = []  # when engines were last replaced
        self._tasks: list[asyncio.Task] = []  # the engines' and workers' watches
        self._life_tasks: list[asyncio.Task] = []  # supervisor, monitor, watchdog

    @property
    def http(self):
        return self.servers.http

    # -- start ------------------------------------------------------------------------

    async def start(self) -> None:
        self._claims = claim_addresses(self.cfg)  # before anything loads
        await self.servers.set_health(False)
        await self.servers.start()
        # the extra front ends start while the model loads, and the daemon is ready once
        # each listens: readiness means the whole capacity (a balancer sends it all)
        self.workers = [FrontendWorker(self.cfg) for _ in range(self.cfg.server.frontends - 1)]
        self._tasks += [asyncio.create_task(self._watch_worker(w)) for w in self.workers]
        self.notifier.status("loading the model")
        engine, served = await self._start_engine(self.cfg)
        self._swap(engine, served, self.cfg.limits)
        await asyncio.gather(*(w.listening for w in self.workers))  # one that ends stops us
        metrics_port = None
        if self.cfg.server.metrics_port is not None:
            metrics_port = self.metrics.serve(self.cfg.server.metrics_port)
        limit = lambda: self.cfg.server.engine_call_limit_seconds  # noqa: E731 - reloadable
        self._life_tasks += [asyncio.create_task(self._supervise()),
                             asyncio.create_task(kill_the_hung(self.engines, limit))]
        if self.notifier.watchdog_seconds:
            self._life_tasks.append(asyncio.create_task(
                feed_the_watchdog(self.notifier, self._down_for, limit)))
        await self._become(Life.SERVING)
        facts = served.facts
        self.notifier.ready(f"serving {facts.name} on {', '.join(self.cfg.server.listen)}")
        log.info("serving", listen=list(self.cfg.server.listen),
                 http=self.http.url if self.http else None, model=facts.name,
                 engine=facts.engine, n_ctx=facts.info.n_ctx, sha256=facts.sha256,
                 metrics_port=metrics_port, config=self.cfg.source)

    async def _start_engine(self, cfg: Config) -> tuple[EngineProcess, ServedModel]:
        """A new engine process, loaded and warmed, and the front end's view of it."""
        self._generation += 1
        address = f"ipc://{self._run_dir}/engine-{self._generation}.sock"
        engine = EngineProcess(cfg, address)
        self.engines.add(engine)
        engine.ended.add_done_callback(lambda _: self.engines.discard(engine))
        try:
            facts = await engine.ready()
            served = await ServedModel.open(facts, address, cfg.limits)
        except BaseException:
            engine.kill()
            raise
        self._tasks.append(asyncio.create_task(self._watch(engine, served)))
        return engine, served

    def _swap(self, engine: EngineProcess, served: ServedModel, limits) -> None:
        """`engine` serves from now on, in every front end; the one before it answers
        what it holds, then exits."""
        old, self.engine, self.frontend.current = self.engine, engine, served
        self._tell_workers(Serve(served.facts, engine.address, limits))
        if old is not None:
            old.stop()

    async def _become(self, life: Life, status: str = "") -> None:
        """The one place the daemon's state changes, with what says so outside."""
        self.life = life
        serving = life in (Life.SERVING, Life.RELOADING)
        if serving:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = time.monotonic()
        self.metrics.engine_up.set(int(serving))
        await self.servers.set_health(serving)
        if status:
            self.notifier.status(status)

    def _down_for(self) -> float:
        """Seconds since an engine last served; 0 while one serves."""
        return time.monotonic() - self.down_since if self.down_since else 0.0

    def _tell_workers(self, message: Serve | Down | Stop) -> None:
        for worker in self.workers:
            worker.send(message)

    # -- the supervisor: reloads and replacements, one at a time ----------------------------

    def reload(self) -> None:
        """SIGHUP: re-read the config once the supervisor is free."""
        self._reload_asked = True
        self._wake.set()

    async def _supervise(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._reload_asked:
                self._reload_asked = False
                await self._reload()
            if self.engine is None:
                await self._replace()

    async def _reload(self) -> None:
        """Apply what changed: a changed model (or engine setting) is loaded in a new
        engine process while the running one serves; a bad config keeps the running one."""
        self.notifier.reloading()
        try:
            new = self._reread() if self._reread else self.cfg
            check_listeners(new)
            if _engine_side(new) != _engine_side(self.cfg) and self.engine is not None:
                await self._become(Life.RELOADING, "loading the new model")
                self._swap(*await self._start_engine(new), new.limits)
            if (new.server.listen, new.tls, new.server.frontends, new.http) != (
                    self.cfg.server.listen, self.cfg.tls, self.cfg.server.frontends,
                    self.cfg.http):
                log.warning("listeners, TLS, HTTP and front-end processes change only on "
                            "restart", listen=new.server.listen)
            self.frontend.max_queue, self.frontend.limits = new.server.max_queue, new.limits
            self.frontend.request_timeout = new.server.request_timeout_seconds
            configure(level=new.server.log_level, fmt=new.server.log_format, stream=sys.stdout)
            self.cfg = new
            log.info("configuration reloaded", config=new.source)
        except Exception as e:  # noqa: BLE001 - keep serving with what runs now
            log.error("reload refused; the running configuration stays", error=str(e))
        if self.engine is not None:
            await self._become(Life.SERVING, f"serving {self.frontend.current.facts.name}")
        self.notifier.ready()

    async def _replace(self) -> None:
        """A new engine for one that ended or hung; a daemon whose engines keep failing
        gives up, for systemd to restart it whole."""
        now = time.monotonic()
        self._replaced = [t for t in self._replaced if now - t < REPLACEMENT_WINDOW] + [now]
        if len(self._replaced) > MAX_REPLACEMENTS:
            return self._give_up(f"{MAX_REPLACEMENTS} engines replaced within "
                                 f"{REPLACEMENT_WINDOW:g} s and the last one ended too")
        try:
            engine, served = await self._start_engine(self.cfg)
        except Exception as e:  # noqa: BLE001 - systemd restarts the whole service
            return self._give_up("the replacement engine could not load", error=str(e))
        self._swap(engine, served, self.cfg.limits)
        await self._become(Life.SERVING, f"serving {served.facts.name}")
        log.info("engine replaced", pid=engine.pid)

    # -- an engine's end, a hung engine ----------------------------------------------------

    async def _watch(self, engine: EngineProcess, served: ServedModel) -> None:
        """When an engine process ends, every request it held is refused at once; if it
        was the serving one, the supervisor replaces it."""
        code = await engine.ended
        process_ended(engine.pid)
        error = engine.ended_by or EngineDied(code)
        answered = served.client.answered
        served.client.fail_all(error)
        await served.client.close()
        if engine is not self.engine or self.life is Life.DRAINING:
            return
        self.engine = self.frontend.current = None
        self._tell_workers(Down(WireError.of(error)))
        reason = ("a hang" if engine.ended_by else "an engine failure"
                  if code == EXIT_ENGINE_FAILED else f"exit code {code}")
        log.error("reloading the model after an engine failure", reason=reason, exit_code=code,
                  signal=_signal_name(code), answered=answered)
        await self._become(Life.ENGINE_DOWN, f"replacing the engine after {reason}")
        self._wake.set()

    async def _watch_worker(self, worker: FrontendWorker) -> None:
        """A front-end process that ends unasked ends the service: systemd restarts it
        whole, so that its share of the listeners comes back."""
        code = await worker.ended
        if self.life is not Life.DRAINING:
            self._give_up("a front-end process ended", pid=worker.process.pid, exit_code=code)

    def _give_up(self, why: str, **fields) -> None:
        log.critical(f"{why}; exiting for the service manager to restart", **fields)
        self.exit_code = 1
        self.stopped.set()

    # -- stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Drain: NOT_SERVING, new requests UNAVAILABLE, accepted ones answered within the
        grace; what cannot finish in it is refused as the server stopping (retryable).
        Then every engine process is stopped, and killed if it does not end."""
        self.life = Life.DRAINING
        self.notifier.stopping()
        for task in self._life_tasks:  # an engine loading is killed as its load is cancelled
            task.cancel()
        grace = self.cfg.server.grace_seconds
        self._tell_workers(Stop())  # they drain beside this process
        await self.servers.drain(grace)
        await self.servers.close()
        await asyncio.gather(*(w.stop(grace + 5) for w in self.workers))
        engines = list(self.engines)
        for engine in engines:
            engine.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(e.ended)
                                                    for e in engines)), 10)
        for engine in engines:
            engine.kill()
        for task in self._tasks:
            task.cancel()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        for claim in self._claims:
            claim.close()


def _signal_name(code: int | None) -> str:
    return signal.Signals(-code).name if code is not None and code < 0 else ""


async def serve(cfg: Config, reread: Callable[[], Config] | None = None) -> int:
    daemon = Daemon(cfg, reread)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopped.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    starting = asyncio.create_task(daemon.start())
    stopped = asyncio.create_task(daemon.stopped.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while the first engine loads
            starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting  # raises what stopped the start
        await stopped
        log.info("stopping", grace_s=cfg.server.grace_seconds)
    finally:
        stopped.cancel()
        await daemon.stop()
    return daemon.exit_code
