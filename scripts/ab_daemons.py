"""One client's latency on two running daemons, paired: requests go to A and B in turn
(ABBA order), each a text of its own, so that the machine's drift (on a small shared host
a run moves by half between minutes) falls on both alike. Prints each daemon's median
latency and overhead (latency less the engine's compute), and the median of B - A over
adjacent pairs with a 95% bootstrap interval.

    decider serve --model M --listen unix:///tmp/a.sock ...   # the commit before
    decider serve --model M --listen unix:///tmp/b.sock ...   # this one
    python scripts/ab_daemons.py unix:///tmp/a.sock unix:///tmp/b.sock --requests 1000
"""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc
import numpy as np

from decider.bench.daemon import requests
from decider.service.convert import request_to_proto
from decider.v1 import decider_pb2_grpc as pb_grpc

WARMUP = 100


async def measure(addresses: list[str], n: int, tokens: int) -> np.ndarray:
    """(n, 2, 2): per pair, per daemon, latency and overhead in ms."""
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    calls = [pb_grpc.DeciderStub(c).Decide for c in channels]
    protos = [request_to_proto(r) for r in requests(tokens, 2 * (n + WARMUP), 900_000)]
    out = np.zeros((n + WARMUP, 2, 2))
    for i in range(n + WARMUP):
        order = (0, 1) if i % 2 == 0 else (1, 0)  # ABBA
        for k in order:
            t0 = time.perf_counter()
            reply = await calls[k](protos[2 * i + k], timeout=60)
            ms = 1000 * (time.perf_counter() - t0)
            out[i, k] = ms, ms - reply.timings.compute_ms
    for c in channels:
        await c.close()
    return out[WARMUP:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--requests", type=int, default=1000, help="pairs measured")
    p.add_argument("--tokens", type=int, default=120, help="approximate prompt tokens")
    args = p.parse_args()
    out = asyncio.run(measure([args.a, args.b], args.requests, args.tokens))
    rng = np.random.default_rng(0)
    for j, name in enumerate(("latency", "overhead")):
        diff = out[:, 1, j] - out[:, 0, j]
        boot = np.median(rng.choice(diff, (2000, len(diff))), axis=1)
        lo, hi = np.percentile(boot, [2.5, 97.5])
        print(f"{name:8s} p50 ms  A {np.median(out[:, 0, j]):.3f}  B {np.median(out[:, 1, j]):.3f}"
              f"  B - A {np.median(diff):+.3f} (95% {lo:+.3f} to {hi:+.3f})")


if __name__ == "__main__":
    main()
