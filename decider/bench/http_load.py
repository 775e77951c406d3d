"""An HTTP load generator for a System One server: requests/s and latency percentiles at a
number of concurrent clients, each sending one request after another on a connection of
its own (what `decider bench --server http://...` prints).

    rows = asyncio.run(http_load("http://127.0.0.1:8080", [body], clients=(1, 16)))

aiohttp, not httpx2: httpx2's client costs more per request than the server does
(docs/experiments.md), and a bench should measure the server.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import statistics
import time
from collections.abc import Sequence

import aiohttp


async def _level(base_url: str, contents: list[bytes], headers: dict, clients: int,
                 per_client: int, verify: bool | str) -> dict:
    latencies, computes = [], []
    tls = ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    connector = aiohttp.TCPConnector(limit=clients, ssl=tls if tls is not True else None)
    async with aiohttp.ClientSession(base_url, headers=headers, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:

        async def client(k: int, n: int) -> None:
            for j in range(n):
                t0 = time.perf_counter()
                content = contents[(k * n + j) % len(contents)]
                async with http.post("/v1/systemone", data=content) as reply:
                    answer = await reply.read()
                    latencies.append(1000 * (time.perf_counter() - t0))
                    reply.raise_for_status()
                computes.append(json.loads(answer)["x_decider"]["compute_ms"])

        await asyncio.gather(*(client(k, 1) for k in range(clients)))  # connect, warm up
        latencies.clear(), computes.clear()
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(k, per_client) for k in range(clients)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"clients": clients, "calls": len(latencies) + clients, "rps": len(latencies) / wall,
            "p50": statistics.median(latencies), "p99": q[98],
            "compute_p50": statistics.median(computes),
            "overhead_p50": statistics.median(a - b for a, b in zip(latencies, computes)),
            "client_cpu_ms": 1000 * cpu / len(latencies)}


async def http_load(base_url: str, bodies: Sequence[dict], *,
                    clients: Sequence[int] = (1, 4, 16, 64), per_client: int = 8,
                    api_key: str | None = None, verify: bool | str = True) -> list[dict]:
    """One row per concurrency: clients, rps, p50, p99 (ms), compute_p50 (the engine's own
    ms, from the answers), overhead_p50 (latency less compute, per request) and
    client_cpu_ms (this process's CPU time per request: the client's own cost). `verify`:
    check an https server's certificate (True), against this CA file (a path), or not.
    Client k's j-th request sends bodies[(k * per_client + j) % len(bodies)]."""
    contents = [json.dumps(body).encode() for body in bodies]
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return [await _level(base_url, contents, headers, n, per_client, verify) for n in clients]
