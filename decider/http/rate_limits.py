"""Per-caller rate limits for the HTTP API: requests a minute and a day for each API key
(each host where no keys are asked), beside the queue's fair share, which divides what
the engine can do among the callers waiting now. A request past a limit is refused
before its body is read: 429 with Retry-After, and every answer to a limited caller
carries the RateLimit-Policy and RateLimit fields of the IETF draft
(draft-ietf-httpapi-ratelimit-headers-10).

The counts are the `limits` library's moving windows, kept in this process: a daemon
with several front-end processes would count each caller in each of them, so the
config refuses rate limits beside `frontends` above 1 (docs/systemone.md).
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, RateLimitItemPerDay, RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from .errors import Refused


class RateLimits:
    def __init__(self, per_minute: int = 0, per_day: int = 0) -> None:
        """0: no limit of that window."""
        self.windows: list[tuple[str, RateLimitItem]] = [
            (name, item(n)) for name, item, n in (("minute", RateLimitItemPerMinute, per_minute),
                                                  ("day", RateLimitItemPerDay, per_day)) if n]
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._policy = ", ".join(f'"{name}";q={item.amount};w={item.get_expiry()}'
                                 for name, item in self.windows)

    def __bool__(self) -> bool:
        return bool(self.windows)

    def take(self, caller: str) -> list[tuple[bytes, bytes]]:
        """Count one request of `caller`, and the header fields its answer carries; a
        caller past a window is refused (429) and nothing is counted."""
        left = []
        for name, item in self.windows:
            stats = self._limiter.get_window_stats(item, caller)
            reset = max(1, math.ceil(stats.reset_time - time.time()))
            if stats.remaining < 1:
                raise Refused(429, "RATE_LIMITED", f"over this key's limit of {item.amount} "
                              f"requests a {name}; try again in {reset} s",
                              headers={"Retry-After": str(reset), **self._fields(name, 0, reset)},
                              limit=item.amount, window=name)
            left.append((stats.remaining - 1, name, reset))
        for _, item in self.windows:
            self._limiter.hit(item, caller)
        remaining, name, reset = min(left)  # the window closest to its limit
        return [(k.lower().encode(), v.encode())
                for k, v in self._fields(name, remaining, reset).items()]

    def _fields(self, name: str, remaining: int, reset: int) -> dict[str, str]:
        return {"RateLimit-Policy": self._policy, "RateLimit": f'"{name}";r={remaining};t={reset}'}
