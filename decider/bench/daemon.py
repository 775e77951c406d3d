"""`decider bench --server ADDRESS`: a running daemon under load, beside the engine's own
rate on the same requests.

The load comes from several client processes (--client-processes), each running its
share of the concurrent clients on a few gRPC channels, so that the load generator is not
the limit. Each client sends one request after another: yes/no on the same ~N-token text
family the engine rate uses. With --model (the daemon's model, loaded here in-process)
the engine's rate on those requests is measured too, in batches of --max-batch, and the
ratio service / engine printed beside each row. An http:// or https:// address measures
the System One HTTP API instead (decider.bench.http_load, one process).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Sequence

from ..questions import Request, YesNo

WORDS = ("order parcel refund late broken screen price paid twice delivery support email "
         "account password login error charge card bank customer invoice").split()
QUESTIONS = ["Does the customer ask for a refund?", "Is the customer angry?",
             "Is this about a delivery?", "Is a payment mentioned?"]


def requests(tokens: int, n: int) -> list[Request]:
    """n yes/no requests of about `tokens` prompt tokens, texts varied so none repeats."""
    words = tokens * 2 // 3
    return [Request(" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)),
                    (YesNo(QUESTIONS[i % len(QUESTIONS)]),)) for i in range(n)]


async def _drive(address: str, clients: int, per_client: int, tokens: int) -> dict:
    import grpc

    from ..service.convert import request_to_proto
    from ..v1 import decider_pb2_grpc as pb_grpc

    protos = [request_to_proto(r) for r in requests(tokens, 64)]
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(8, clients))]
    stubs = [pb_grpc.DeciderStub(c) for c in channels]
    out = {"latency": [], "compute": [], "queue": [], "refused": 0, "failed": {}}

    async def client(k: int, n: int) -> None:
        stub = stubs[k % len(stubs)]
        for j in range(n):
            t0 = time.perf_counter()
            try:
                reply = await stub.Decide(protos[(k + j) % len(protos)], timeout=600)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    out["refused"] += 1
                else:
                    out["failed"][e.code().name] = out["failed"].get(e.code().name, 0) + 1
                continue
            out["latency"].append(1000 * (time.perf_counter() - t0))
            out["compute"].append(reply.timings.compute_ms)
            out["queue"].append(reply.timings.queue_ms)

    await asyncio.gather(*(client(k, 1) for k in range(len(stubs))))  # connect
    for v in out.values():
        if isinstance(v, list):
            v.clear()
    started = time.perf_counter()
    await asyncio.gather(*(client(k, per_client) for k in range(clients)))
    out["wall"] = time.perf_counter() - started
    for c in channels:
        await c.close()
    return out


def _client_process(address, clients, per_client, tokens, barrier, conn) -> None:
    barrier.wait()  # every process starts its load at once
    conn.send(asyncio.run(_drive(address, clients, per_client, tokens)))


def load(address: str, clients: int, per_client: int, tokens: int, processes: int) -> dict:
    """One concurrency level, spread over `processes` client processes."""
    ctx = multiprocessing.get_context("spawn")
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    shares = [s for s in shares if s]
    barrier = ctx.Barrier(len(shares))
    pipes = [ctx.Pipe() for _ in shares]
    procs = [ctx.Process(target=_client_process, args=(address, s, per_client, tokens,
                                                       barrier, child))
             for s, (_, child) in zip(shares, pipes)]
    for p in procs:
        p.start()
    parts = [parent.recv() for parent, _ in pipes]
    for p in procs:
        p.join()
    got = {k: [x for part in parts for x in part[k]] for k in ("latency", "compute", "queue")}
    answered = len(got["latency"])
    q = statistics.quantiles(got["latency"], n=100) if answered > 1 else got["latency"] * 99
    return {"clients": clients, "rps": answered / max(p["wall"] for p in parts),
            "p50": statistics.median(got["latency"]), "p99": q[98],
            "queue_p50": statistics.median(got["queue"]),
            "compute_p50": statistics.median(got["compute"]),
            "overhead_p50": statistics.median(a - b for a, b in zip(got["latency"],
                                                                    got["compute"])),
            "refused": sum(p["refused"] for p in parts),
            "failed": sum(sum(p["failed"].values()) for p in parts),
            "failures": {code: sum(p["failed"].get(code, 0) for p in parts)
                         for code in {c for p in parts for c in p["failed"]}}}


def engine_rate(model: str, tokens: int, max_batch: int, repeat: int = 15, **options
                ) -> float:
    """Decisions/s of the model's engine in this process: engine.score on batches of
    max_batch of the bench's requests, planned beforehand, the engine warmed up as the
    daemon's is: what the daemon could deliver at best."""
    from ..api import Decider

    with Decider(model, **options) as d:
        jobs = [d.plan(r).job for r in requests(tokens, max_batch)]
        d.engine.warm_up(max_batch)
        d.engine.score(jobs)
        seconds = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            d.engine.score(jobs)
            seconds.append(time.perf_counter() - t0)
    return max_batch / statistics.median(seconds)


def run_service_bench(address: str, *, clients: Sequence[int] = (1, 64, 256, 1024),
                      per_client: int = 8, tokens: int = 120, processes: int = 4,
                      model: str | None = None, max_batch: int = 128, **options) -> list[dict]:
    if address.startswith(("http://", "https://")):
        import json
        import urllib.request

        from .http_load import http_load

        with urllib.request.urlopen(f"{address}/v1/models") as reply:  # the served name
            served = json.load(reply)["models"][0]["name"]
        body = {"model": served, "state": requests(tokens, 1)[0].text,
                "questions": {"refund": {"type": "noul", "instructions": QUESTIONS[0]}}}
        rows = asyncio.run(http_load(address, body, clients=clients, per_client=per_client))
    else:
        rows = [load(address, n, per_client, tokens, min(processes, n)) for n in clients]
    rate = engine_rate(model, tokens, max_batch, **options) if model else None
    print(f"daemon at {address}, one yes/no per request, ~{tokens} prompt tokens, "
          f"{per_client} requests per client, {processes} client processes")
    if rate:
        print(f"engine in-process: {rate:.0f} decisions/s ({model}, batches of {max_batch})")
    print(f"{'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'queue p50':>10} "
          f"{'engine p50':>11} {'overhead p50':>13} {'refused':>8} {'failed':>7} "
          f"{'service/engine':>15}")
    for r in rows:
        ratio = f"{r['rps'] / rate:.0%}" if rate else "-"
        print(f"{r['clients']:>7} {r['rps']:>8.0f} {r['p50']:>8.2f} {r['p99']:>8.2f} "
              f"{r.get('queue_p50', 0):>10.2f} {r['compute_p50']:>11.2f} "
              f"{r['overhead_p50']:>13.2f} "
              f"{r.get('refused', 0):>8} {r.get('failed', 0):>7} {ratio:>15} "
              f"{r.get('failures') or ''}")
    return rows
