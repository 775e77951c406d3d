"""Metrics for operators, in the Prometheus text format on an opt-in HTTP port.

The daemon is several processes (the front end, the engine process, and the engine
processes that replace it), so it runs prometheus_client's multiprocess mode: each process
writes its values to files in one private directory (PROMETHEUS_MULTIPROC_DIR, set by
`decider serve` before anything imports prometheus_client) and the endpoint sums them.
Outside the daemon, each Metrics object owns its registry and the library never writes
to the global one."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    def __init__(self) -> None:
        _check_multiprocess_mode()
        self.registry = r = CollectorRegistry()
        self.requests = Counter("decider_requests", "Decisions asked for, by outcome (OK or "
                                "an error reason)", ["outcome"], registry=r)
        self.latency = Histogram("decider_request_seconds", "Decide latency, end to end",
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
                                          2.5, 5, 10, 30), registry=r)
        self.prompt_tokens = Counter("decider_prompt_tokens", "Prompt tokens of answered "
                                     "requests", registry=r)
        # the engine process's
        self.queue_depth = Gauge("decider_queue_depth", "Requests waiting for the engine",
                                 registry=r, multiprocess_mode="livesum")
        self.engine_busy = Gauge("decider_engine_busy", "1 while an engine call runs",
                                 registry=r, multiprocess_mode="livesum")
        self.engine_calls = Counter("decider_engine_calls", "Engine calls", registry=r)
        self.engine_requests = Counter("decider_engine_requests", "Requests that reached "
                                       "the engine", registry=r)
        self.engine_shared_prefix = Counter(
            "decider_engine_shared_prefix_requests", "Requests whose prefix another request "
            "of the same engine call read (one job for both)", registry=r)
        self.engine_failures = Counter("decider_engine_failures", "Engine calls that failed, "
                                       "by reason", ["reason"], registry=r)
        self.cache_lookups = Counter("decider_prefix_cache_lookups", "Requests that looked "
                                     "for their prefix in the engine's prefix cache, by "
                                     "result (hit, miss)", ["result"], registry=r)
        self.cache_tokens = Counter("decider_prefix_cache_hit_tokens", "Prefix tokens read "
                                    "from the prefix cache instead of computed", registry=r)
        self.cache_evictions = Counter("decider_prefix_cache_evictions", "Saved prefixes "
                                       "dropped to stay within the cache's budget", registry=r)
        self.cache_bytes = Gauge("decider_prefix_cache_bytes", "Bytes the prefix cache holds",
                                 registry=r, multiprocess_mode="livesum")
        # the daemon's
        self.engine_up = Gauge("decider_engine_up", "1 while an engine process is serving",
                               registry=r, multiprocess_mode="livesum")

    def exposed(self) -> CollectorRegistry:
        """What an endpoint shows: in the daemon every process's values summed."""
        if not os.environ.get(MULTIPROCESS_DIR):
            return self.registry
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint in a thread; returns the port (0 picks a free one)."""
        server, _ = start_http_server(port, addr=addr, registry=self.exposed())
        return server.server_port


def _check_multiprocess_mode() -> None:
    """With PROMETHEUS_MULTIPROC_DIR set, values must go to its files: a process that
    imported prometheus_client before the variable was set keeps them in memory, where
    the endpoint never sees them."""
    from prometheus_client import values

    if os.environ.get(MULTIPROCESS_DIR) and values.ValueClass is values.MutexValue:
        raise RuntimeError(f"prometheus_client was imported before {MULTIPROCESS_DIR} was "
                           "set: this process's metrics would be lost")


def process_ended(pid: int) -> None:
    """Drop a dead process's live gauges (its counters keep counting in the sums)."""
    if os.environ.get(MULTIPROCESS_DIR):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
