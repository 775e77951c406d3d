"""An HTTP load generator for a System One server: requests/s and latency percentiles at a
number of concurrent clients, each a connection of its own sending one request after
another (what `decider bench --server http://...` prints).

    rows = asyncio.run(http_load("http://127.0.0.1:8080", body, clients=(1, 16)))
"""

from __future__ import annotations

import asyncio
import json
import ssl
import statistics
import time
from collections.abc import Sequence

import httpx2


async def _level(base_url: str, content: bytes, headers: dict, clients: int,
                 per_client: int, verify: bool | str) -> dict:
    latencies, computes = [], []
    limits = httpx2.Limits(max_connections=clients, max_keepalive_connections=clients)
    if isinstance(verify, str):
        verify = ssl.create_default_context(cafile=verify)
    async with httpx2.AsyncClient(base_url=base_url, headers=headers, limits=limits,
                                  timeout=600, verify=verify) as http:

        async def client(n: int) -> None:
            for _ in range(n):
                t0 = time.perf_counter()
                reply = await http.post("/v1/systemone", content=content)
                latencies.append(1000 * (time.perf_counter() - t0))
                reply.raise_for_status()
                computes.append(reply.json()["decider"]["compute_ms"])

        await asyncio.gather(*(client(1) for _ in range(clients)))  # connect, warm up
        latencies.clear(), computes.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(client(per_client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"clients": clients, "rps": len(latencies) / wall,
            "p50": statistics.median(latencies), "p99": q[98],
            "compute_p50": statistics.median(computes),
            "overhead_p50": statistics.median(a - b for a, b in zip(latencies, computes))}


async def http_load(base_url: str, body: dict, *, clients: Sequence[int] = (1, 4, 16, 64),
                    per_client: int = 8, api_key: str | None = None,
                    verify: bool | str = True) -> list[dict]:
    """One row per concurrency: clients, rps, p50, p99 (ms), compute_p50 (the engine's own
    ms, from the answers) and overhead_p50 (latency less compute, per request). `verify`:
    check an https server's certificate (True), against this CA file (a path), or not."""
    content = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return [await _level(base_url, content, headers, n, per_client, verify) for n in clients]
