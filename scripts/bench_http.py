"""What the HTTP front end adds to a decision at one client: the same yes/no through
`backend.submit` in this process, and through POST /v1/systemone from a client process of
its own (decider.http.load), on one Decider and Scheduler.

    python scripts/bench_http.py MODEL.gguf [--requests 300] [--rounds 3] [--threads 1]

Each side's overhead is its latency less the engine's own time for that request (the
outcome's compute_ms), so the engine's time cancels; the HTTP overhead is the difference
of the two medians, per round (in-process, HTTP, in-process again). On a shared machine
the least of the rounds is the one least disturbed. Use a tiny model
(scripts/make_tiny_gguf.py) so the engine's time is small beside what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

from decider import Decider, Request, YesNo
from decider.config import Config, HttpSection
from decider.http.backend import LocalBackend
from decider.http.serve import serve_http
from decider.logs import configure

TEXT = "My parcel was due on Monday and it has still not arrived. Where is it?"
QUESTION = "Is the customer asking about a late delivery?"
CLIENT = """
import asyncio, json, sys
from decider.http.load import http_load
url, body, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps(asyncio.run(http_load(url, body, clients=(1,), per_client=n))[0]))
"""


async def in_process(backend: LocalBackend, n: int) -> tuple[float, float]:
    """The median of latency less compute over n submits, and this thread's CPU ms a
    submit (the event loop's: the engine runs in a thread of its own)."""
    overheads = []
    request = Request(TEXT, (YesNo(QUESTION),))
    await backend.submit(request, None)  # warm-up
    cpu = time.thread_time()
    for _ in range(n):
        t0 = time.perf_counter()
        outcome = await backend.submit(request, None)
        overheads.append(1000 * (time.perf_counter() - t0) - outcome.compute_ms)
    return statistics.median(overheads), 1000 * (time.thread_time() - cpu) / n


async def over_http(url: str, body: dict, n: int) -> tuple[dict, float]:
    """The load generator's row, and this thread's CPU ms a request (uvicorn, the app, the
    scheduler; the client's start-up included, its n requests dwarf it)."""
    cpu = time.thread_time()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, url, json.dumps(body), str(n), stdout=subprocess.PIPE)
    row = json.loads((await client.communicate())[0])
    return row, 1000 * (time.thread_time() - cpu) / (n + 1)


async def main(model: str, n: int, rounds: int, threads: int) -> None:
    configure(level="info", fmt="json", stream=open(os.devnull, "w"))  # as the daemon logs
    decider = Decider(model, n_ctx=512, n_threads=threads)
    backend = LocalBackend(decider)
    backend.start()
    handle = await serve_http(replace(Config(), http=HttpSection(address="127.0.0.1:0")),
                              backend)
    body = {"model": decider.entry.name, "state": TEXT,
            "questions": {"late": {"type": "noul", "instructions": QUESTION}}}
    print(f"{n} requests each way a round, one client, engine threads {threads}")
    print("overhead: latency less the engine's time, median; CPU: ms a request, the server's "
          "event loop (+ the client)")
    print(f"{'round':>5} {'in-process':>11} {'HTTP':>7} {'added':>7} {'CPU in-process':>15} "
          f"{'CPU HTTP':>9} {'CPU client':>11} {'CPU added':>10}  (ms)")
    added, cpu_added = [], []
    for r in range(rounds):
        (before, cpu_before), (http, cpu_http) = (await in_process(backend, n),
                                                  await over_http(handle.url, body, n))
        after, cpu_after = await in_process(backend, n)
        local, cpu_local = (before + after) / 2, (cpu_before + cpu_after) / 2
        added.append(http["overhead_p50"] - local)
        cpu_added.append(cpu_http - cpu_local + http["client_cpu_ms"])
        print(f"{r + 1:>5} {local:>11.3f} {http['overhead_p50']:>7.3f} {added[-1]:>7.3f} "
              f"{cpu_local:>15.3f} {cpu_http:>9.3f} {http['client_cpu_ms']:>11.3f} "
              f"{cpu_added[-1]:>10.3f}")
    print(f"HTTP overhead at one client, least of {rounds} rounds: {min(added):.3f} ms of "
          f"latency, {min(cpu_added):.3f} ms of CPU (medians {statistics.median(added):.3f}, "
          f"{statistics.median(cpu_added):.3f})")
    await handle.stop()
    await backend.close()
    decider.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    asyncio.run(main(a.model, a.requests, a.rounds, a.threads))
