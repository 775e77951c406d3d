"""`decider bench --server ADDRESS`: a running daemon under load, beside the engine's own
rate on the same requests.

The load comes from several client processes (--client-processes), each running its
share of the concurrent clients on a few gRPC channels, so that the load generator is not
the limit. Each client sends one request after another: yes/no on the same ~N-token text
family the engine rate uses. With --model (the daemon's model, loaded here in-process)
the engine's rate on those requests is measured too, in batches of --max-batch and in
batches of each level's client count where that is fewer (n clients never fill a call
past n), and the ratios service / engine beside each row, to both. An http:// or https://
address measures the System One HTTP API instead (decider.bench.http_load, one process).
"""

from __future__ import annotations

import asyncio
import functools
import math
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable, Sequence

from ..questions import Request, YesNo
from .processes import cpu_seconds, daemon_pid, roles

WORDS = ("order parcel refund late broken screen price paid twice delivery support email "
         "account password login error charge card bank customer invoice").split()
LEVEL_TEXTS = 1_000_000  # numbers of the texts a load level may draw
QUESTIONS = ["Does the customer ask for a refund?", "Is the customer angry?",
             "Is this about a delivery?", "Is a payment mentioned?"]


def requests(tokens: int, n: int, first: int = 0) -> list[Request]:
    """n yes/no requests of about `tokens` prompt tokens, numbered from `first`, each text
    drawn by its number: requests that share a text would share an engine job."""
    words = tokens * 2 // 3
    return [Request(" ".join(random.Random(i).choices(WORDS, k=words)),
                    (YesNo(QUESTIONS[i % len(QUESTIONS)]),)) for i in range(first, first + n)]


async def _drive(address: str, clients: int, per_client: int, tokens: int,
                 bare: bool = False, first: int = 0) -> dict:
    """Each client sends its requests one after another, each its own text (numbered from
    `first`); `bare`: health Checks instead."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from ..service.convert import request_to_proto
    from ..v1 import decider_pb2_grpc as pb_grpc

    channels = [grpc.aio.insecure_channel(address) for _ in range(min(8, clients))]
    if bare:
        protos = [health_pb2.HealthCheckRequest()]
        calls = [health_pb2_grpc.HealthStub(c).Check for c in channels]
    else:
        protos = [request_to_proto(r) for r in requests(tokens, clients * per_client, first)]
        calls = [pb_grpc.DeciderStub(c).Decide for c in channels]
    out = {"latency": [], "compute": [], "queue": [], "refused": 0, "failed": {}}

    async def client(k: int, n: int) -> None:
        call = calls[k % len(calls)]
        for j in range(n):
            t0 = time.perf_counter()
            try:
                reply = await call(protos[(k * per_client + j) % len(protos)], timeout=600)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    out["refused"] += 1
                else:
                    out["failed"][e.code().name] = out["failed"].get(e.code().name, 0) + 1
                continue
            out["latency"].append(1000 * (time.perf_counter() - t0))
            out["compute"].append(0.0 if bare else reply.timings.compute_ms)
            out["queue"].append(0.0 if bare else reply.timings.queue_ms)

    await asyncio.gather(*(client(k, 1) for k in range(len(calls))))  # connect
    for v in out.values():
        if isinstance(v, list):
            v.clear()
    out["warmup"] = len(calls)
    started = time.perf_counter()
    await asyncio.gather(*(client(k, per_client) for k in range(clients)))
    out["wall"] = time.perf_counter() - started
    for c in channels:
        await c.close()
    return out


def _client_process(address, clients, per_client, tokens, bare, first, barrier, conn
                    ) -> None:
    barrier.wait()  # every process starts its load at once
    conn.send(asyncio.run(_drive(address, clients, per_client, tokens, bare, first)))


def load(address: str, clients: int, per_client: int, tokens: int, processes: int,
         bare: bool = False) -> dict:
    """One concurrency level, spread over `processes` client processes. "calls" counts
    every call the server answered, the connections' first ones too."""
    ctx = multiprocessing.get_context("spawn")
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    shares = [s for s in shares if s]
    barrier = ctx.Barrier(len(shares))
    pipes = [ctx.Pipe() for _ in shares]
    # every request of the run its own text, levels apart too (a prefix cache would
    # answer a text seen at an earlier level)
    firsts = [LEVEL_TEXTS * clients + per_client * sum(shares[:i]) for i in range(len(shares))]
    procs = [ctx.Process(target=_client_process, args=(address, s, per_client, tokens,
                                                       bare, first, barrier, child))
             for s, first, (_, child) in zip(shares, firsts, pipes)]
    for p in procs:
        p.start()
    parts = [parent.recv() for parent, _ in pipes]
    for p in procs:
        p.join()
    got = {k: [x for part in parts for x in part[k]] for k in ("latency", "compute", "queue")}
    answered = len(got["latency"])
    calls = answered + sum(p["warmup"] for p in parts)
    q = statistics.quantiles(got["latency"], n=100) if answered > 1 else got["latency"] * 99
    return {"clients": clients, "calls": calls, "rps": answered / max(p["wall"] for p in parts),
            "p50": statistics.median(got["latency"]), "p99": q[98],
            "queue_p50": statistics.median(got["queue"]),
            "compute_p50": statistics.median(got["compute"]),
            "overhead_p50": statistics.median(a - b for a, b in zip(got["latency"],
                                                                    got["compute"])),
            "refused": sum(p["refused"] for p in parts),
            "failed": sum(sum(p["failed"].values()) for p in parts),
            "failures": {code: sum(p["failed"].get(code, 0) for p in parts)
                         for code in {c for p in parts for c in p["failed"]}}}


def engine_rates(model: str, tokens: int, batches: Sequence[int], repeat: int = 15,
                 **options) -> dict[int, float]:
    """Decisions/s of the model's engine in this process, at each batch size: engine.score
    on batches of the bench's requests, planned beforehand, new texts each call (as the
    load levels send: a text scored before would come from a prefix cache), the engine
    warmed up as the daemon's is for the largest: what the daemon could deliver at best
    in batches of that size."""
    from ..api import Decider

    with Decider(model, **options) as d:
        d.engine.warm_up(max(batches))
        rates, first = {}, 0  # the first text's number: no text is scored twice
        for batch in sorted(set(batches)):
            calls = [[d.plan(r).job for r in requests(tokens, batch, first + k * batch)]
                     for k in range(repeat + 1)]
            first += (repeat + 1) * batch
            d.engine.score(calls[0])
            seconds = []
            for jobs in calls[1:]:
                t0 = time.perf_counter()
                d.engine.score(jobs)
                seconds.append(time.perf_counter() - t0)
            rates[batch] = batch / statistics.median(seconds)
    return rates


def _costed(measure, processes: Callable[[], dict[str, list[int]]]) -> dict:
    """measure()'s row, with each group of processes' CPU ms per call it answered (the
    groups read again at every level: a daemon may have replaced its engine process)."""
    pids = processes()
    before = {role: cpu_seconds(p) for role, p in pids.items()}
    row = measure()
    for role, p in pids.items():
        row[f"{role} cpu"] = 1000 * (cpu_seconds(p) - before[role]) / row["calls"]
    return row


def _levels(address: str, clients: Sequence[int], per_client: int, tokens: int,
            client_processes: int, bare: bool = False) -> list:
    """One measure per concurrency level, for a gRPC or an HTTP address."""
    if not address.startswith(("http://", "https://")):
        return [functools.partial(load, address, n, per_client, tokens,
                                  min(client_processes, n), bare) for n in clients]
    import json
    import urllib.request

    from .http_load import http_load

    served = "bare"
    if not bare:
        with urllib.request.urlopen(f"{address}/v1/models") as reply:  # the served name
            served = json.load(reply)["models"][0]["name"]

    def bodies(n: int) -> list[dict]:
        return [{"model": served, "state": r.text, "questions": {"refund": {
            "type": "noul", "instructions": QUESTIONS[0]}}}
            for r in requests(tokens, n * per_client, LEVEL_TEXTS * n)]

    return [lambda n=n: asyncio.run(http_load(address, bodies(n), clients=(n,),
                                              per_client=per_client))[0] for n in clients]


def _bare_rows(address: str, clients, per_client, tokens, client_processes,
               hop: bool = False, read_mb: int = 0, busy_ms: float = 0.0) -> list[dict]:
    """The same load on a bare server of the same protocol, in the same run; with `hop`,
    one whose every call crosses to another process (reading `read_mb` MB, busy `busy_ms`
    ms) and back."""
    from .bare import bare_grpc, bare_http

    http = address.startswith(("http://", "https://"))
    with (bare_http if http else bare_grpc)(hop, read_mb, busy_ms) as (pid, bare):
        return [_costed(m, lambda: {"server": [pid]})
                for m in _levels(bare, clients, per_client, tokens, client_processes, bare=True)]


def _one_client_floor(address: str, row: dict, per_client: int, tokens: int, read_mb: int,
                      call_ms: float) -> None:
    """One client against the least a daemon with an engine process can answer in: a bare
    server whose every call crosses to a process busy for the engine's one-job call (as
    measured in-process, reading `read_mb` MB in it) and back. Overheads: each latency less
    the engine's time (the daemon's per request, the floor's busy time)."""
    floor = _bare_rows(address, [1], per_client, tokens, 1, hop=True, read_mb=read_mb,
                       busy_ms=call_ms)[0]
    floor["overhead_p50"] = floor["p50"] - call_ms
    print(f"one client, overhead p50: the daemon {row['overhead_p50']:.2f} ms; its floor, a "
          f"bare server with a hop to a process busy {call_ms:.2f} ms a call (the engine's "
          f"one-job call), {floor['overhead_p50']:.2f} ms; the bare round trip "
          f"{row['bare']['p50']:.2f} ms: decider's own "
          f"{row['overhead_p50'] - floor['overhead_p50']:.2f} ms")
    row["floor"] = floor


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def run_service_bench(address: str, *, clients: Sequence[int] = (1, 64, 256, 1024),
                      per_client: int = 8, tokens: int = 120, processes: int = 4,
                      model: str | None = None, max_batch: int = 128, pid: int | None = None,
                      floor_read_mb: int = 0, **options) -> list[dict]:
    """The daemon at `address` under load, level by level; with its pid (found for a unix
    socket) each level's CPU per request in its front ends and its engine process, beside
    a bare server's per call under the same load and a bare server's whose calls each
    cross to another process (bench/bare.py: the floor of a front end with an engine
    process; floor_read_mb: what that process reads a call, as a CPU engine's weights)."""
    pid = pid or daemon_pid(address)
    rows = [_costed(m, lambda: roles(pid) if pid else {})
            for m in _levels(address, clients, per_client, tokens, processes)]
    bare = _bare_rows(address, clients, per_client, tokens, processes) if pid else []
    hop = _bare_rows(address, clients, per_client, tokens, processes, hop=True,
                     read_mb=floor_read_mb) if pid else []
    # n clients, one request each at a time, never fill a call past n: the engine's rate
    # in batches of min(n, max_batch) is the most such a level can get
    batch = {n: min(n, max_batch) for n in clients}
    rates = engine_rates(model, tokens, [max_batch, *batch.values()], **options) \
        if model else {}
    rate = rates.get(max_batch)
    print(f"daemon at {address}, one yes/no per request, ~{tokens} prompt tokens, "
          f"{per_client} requests per client, {processes} client processes")
    if rates:
        print(f"engine in-process ({model}): " + ", ".join(
            f"{rates[b]:.0f} decisions/s in batches of {b}" for b in sorted(rates)))
    print(f"{'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'queue p50':>10} "
          f"{'engine p50':>11} {'overhead p50':>13} {'refused':>8} {'failed':>7} "
          f"{'service/engine':>15} {'its batch':>10}")
    for r in rows:
        ratios = [f"{_ratio(r['rps'], rates[b]):.0%}" if rates else "-"
                  for b in (max_batch, batch[r["clients"]])]
        print(f"{r['clients']:>7} {r['rps']:>8.0f} {r['p50']:>8.2f} {r['p99']:>8.2f} "
              f"{r.get('queue_p50', 0):>10.2f} {r['compute_p50']:>11.2f} "
              f"{r['overhead_p50']:>13.2f} "
              f"{r.get('refused', 0):>8} {r.get('failed', 0):>7} {ratios[0]:>15} "
              f"{ratios[1]:>10} {r.get('failures') or ''}")
    if bare:
        print(f"CPU ms per request (the daemon's processes, /proc) beside a bare server's "
              f"per call under the same load, and a bare server's with a hop to another "
              f"process reading {floor_read_mb} MB a call (pids {roles(pid)}):")
        print(f"{'clients':>7} {'front ends':>11} {'engine':>8} {'bare':>8} {'hop':>8} "
              f"{'front/bare':>11} {'front/hop':>10} {'bare p50 ms':>12} {'hop p50 ms':>11} "
              f"{'p50 - bare':>11}")
        for r, b, h in zip(rows, bare, hop):
            front = r["front ends cpu"]
            print(f"{r['clients']:>7} {front:>11.3f} {r['engine cpu']:>8.3f} "
                  f"{b['server cpu']:>8.3f} {h['server cpu']:>8.3f} "
                  f"{_ratio(front, b['server cpu']):>10.2f}x "
                  f"{_ratio(front, h['server cpu']):>9.2f}x {b['p50']:>12.2f} "
                  f"{h['p50']:>11.2f} {r['p50'] - b['p50']:>11.2f}")
            r["bare"], r["hop"] = b, h
        one = next((r for r in rows if r["clients"] == 1), None)
        if one and 1 in rates:
            _one_client_floor(address, one, per_client, tokens, floor_read_mb, 1000 / rates[1])
        if rate:  # a front-end process is about one core: how many keep up with the engine
            busiest = max(rows, key=lambda r: r["clients"])
            cores = busiest["front ends cpu"] * rate / 1000
            print(f"at the engine's rate the front ends need {cores:.1f} cores "
                  f"({busiest['front ends cpu']:.3f} ms a request at {busiest['clients']} "
                  f"clients): --frontends {math.ceil(cores)}, where the host has those "
                  f"cores beside the engine process's")
    return rows
