"""Metrics for operators, in the Prometheus text format on an opt-in HTTP port.

Each Metrics object owns its registry, so a process can hold several (tests) and the
library never writes to the global one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("decider_requests", "Decide requests by outcome (OK or an "
                                "error reason)", ["outcome"], registry=r)
        self.latency = Histogram("decider_request_seconds", "Decide latency, end to end",
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30),
                                 registry=r)
        self.queue_depth = Gauge("decider_queue_depth", "Requests waiting for the engine",
                                 registry=r)
        self.prompt_tokens = Counter("decider_prompt_tokens", "Prompt tokens of answered "
                                     "requests", registry=r)
        self.engine_calls = Counter("decider_engine_calls", "Engine calls", registry=r)
        self.engine_requests = Counter("decider_engine_requests", "Requests that reached "
                                       "the engine", registry=r)
        self.engine_failures = Counter("decider_engine_failures", "Engine calls that failed, "
                                       "by reason", ["reason"], registry=r)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint in a thread; returns the port (0 picks a free one)."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return server.server_port
