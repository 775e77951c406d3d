"""The daemon's signs of life, both ways: engine processes that stop answering are
killed (`kill_the_hung`; the daemon then replaces them as it replaces a dead one), and
systemd's watchdog is fed while this loop runs and some engine has served recently
(`feed_the_watchdog`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from ..errors import EngineHung
from .engine_process import EngineProcess
from .systemd import Notifier

log = structlog.get_logger("decider.server")

PING_SECONDS = 1.0  # how often the engines are asked for a sign of life


async def kill_the_hung(engines: set[EngineProcess], limit: Callable[[], float]) -> None:
    """Pings every engine; kills one silent past `limit()` seconds (no chunk of a call
    done, no answer between calls)."""
    while True:
        await asyncio.sleep(PING_SECONDS)
        for engine in list(engines):
            silent, allowed = engine.silence(time.monotonic()), limit()
            if silent > allowed:
                log.error("the engine made no progress past its limit; killing it",
                          pid=engine.pid, seconds=round(silent, 1), limit=allowed)
                engine.kill(EngineHung(silent, allowed))


async def feed_the_watchdog(notifier: Notifier, down_for: Callable[[], float],
                            limit: Callable[[], float]) -> None:
    """WATCHDOG=1 at half the period, unless no engine has served for longer than an
    engine may stay silent: then systemd restarts the service (a replacement that never
    finishes loading, say)."""
    while True:
        down, allowed = down_for(), limit()
        if down < allowed:
            notifier.watchdog()
        else:
            log.error("no engine has served past its limit; withholding the watchdog",
                      seconds=round(down, 1), limit=allowed)
        await asyncio.sleep(notifier.watchdog_seconds / 2)
