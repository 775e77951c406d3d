"""Soak a running decider daemon: N clients for D minutes, every answer checked.

Each request of a fixed, varied set is first answered alone, one after another: its
reference. Under load every answer must equal its own request's reference (the llama.cpp
CPU engine scores each job of a call on its own, so the numbers match exactly; --tol
loosens that). The daemon's and its engine process's RSS and open file descriptors are
sampled after a warm-up and at the end. Exit 1 when anything was lost, mixed or refused,
or when RSS or fds grew more than --max-growth percent.

    python -m decider.bench.soak unix:///run/decider/decider.sock --pid PID
    python -m decider.bench.soak --model tiny.gguf   # starts (and stops) its own daemon

decider/bench/faults.py adds an operator's day to it: hostile requests, a reload, a kill.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from decider import Choice, Label, MultiLabel, Request, Scale, YesNo
from decider.bench.processes import read, roles
from decider.client import _remote_error, channel_options, target
from decider.service.convert import request_to_proto
from decider.v1 import decider_pb2 as pb
from decider.v1 import decider_pb2_grpc as pb_grpc

TEXTS = [
    "I was charged twice for my order, please refund me.",
    "My parcel is three weeks late and nobody answers my emails. This is unacceptable!",
    "The app crashes on start since the last update (Android 14, Pixel 7).",
    "Thanks, all good! The replacement arrived yesterday and works fine.",
    "Bonjour, je n'arrive pas à me connecter à mon compte depuis hier. Merci 🙏",
    "Order #4411: the invoice shows 3 items, I received 2.\nPlease check.\n" * 3,
    " ".join(["The screen flickers when the laptop is on battery."] * 12),
]
QUESTIONS = [
    (YesNo("Does the customer ask for a refund?"),),
    (YesNo("Is the customer angry?", threshold=0.7),),
    (Choice("What is the topic?", ["billing", Label("shipping", "parcels, delivery"),
                                   "technical problem", "other"]),),
    (MultiLabel("Which apply?", ["refund", "angry customer", "bug report"], threshold=0.6),),
    (Scale("How urgent is it?", ["low", "medium", "high"]),),
    (YesNo("Is a payment mentioned?"), Scale("Sentiment?", ["bad", "neutral", "good"])),
]


def requests() -> list[pb.DecideRequest]:
    """Every question set on every text, some with instructions: 42 distinct requests."""
    out = []
    for i, text in enumerate(TEXTS):
        for j, questions in enumerate(QUESTIONS):
            instructions = "Answer as a support agent." if (i + j) % 3 == 0 else ""
            out.append(request_to_proto(Request(text, questions, instructions)))
    return out


def fingerprint(reply: pb.DecideResponse) -> tuple:
    """What an answer says: per question its text, kind, labels, probabilities, picks."""
    out = []
    for a in reply.answers:
        kind = a.WhichOneof("kind")
        k = getattr(a, kind)
        if kind == "yes_no":
            labels, probs, picks = (), (k.p_yes,), (k.decision,)
        elif kind == "multi_label":
            labels = tuple(d.label for d in k.labels)
            probs, picks = tuple(d.p for d in k.labels), tuple(k.chosen)
        else:
            labels = tuple(p.label for p in k.probabilities)
            probs = tuple(p.p for p in k.probabilities)
            picks = (k.label if kind == "choice" else k.level,)
        out.append((a.question, kind, labels, (*probs, a.label_mass), picks))
    return tuple(out)


def deviation(got: tuple, want: tuple) -> float:
    """Largest probability difference; inf when the answers are of other questions."""
    if [g[:3] for g in got] != [w[:3] for w in want]:
        return float("inf")
    return max((abs(a - b) for g, w in zip(got, want) for a, b in zip(g[3], w[3])),
               default=0.0)


async def references(address: str, reqs: list[pb.DecideRequest],
                     timeout: float = 120) -> list[tuple]:
    """Each request answered alone, sequentially: what it must get under load."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.DeciderStub(channel)
        return [fingerprint(await stub.Decide(r, timeout=timeout)) for r in reqs]


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    mixed: int = 0  # answered with numbers other than its request's reference
    lost: int = 0  # no reply within the call's deadline
    errors: collections.Counter = field(default_factory=collections.Counter)
    max_dev: float = 0.0
    seconds: float = 0.0
    outcomes: list = field(default_factory=list)  # (monotonic, code, reason) when kept
    hostile: list = field(default_factory=list)  # (monotonic, what, code): faults.py's

    def ok(self) -> bool:
        return not (self.mixed or self.lost or self.errors) and self.answered == self.sent


async def load(address: str | Sequence[str], reqs: list, refs: list[tuple], *, clients: int,
               seconds: float, channels: int = 4, tol: float = 0.0, timeout: float = 60,
               keep: bool = False, stop: asyncio.Event | None = None,
               backoff: float = 0.0, tally: Tally | None = None,
               balanced: bool = False) -> Tally:
    """`clients` loops, each sending request k, k+1, ... until `seconds` pass (or `stop`).
    keep: record every outcome (time, code name, reason); backoff: sleep after an error;
    tally: one the caller watches while the load runs; balanced: channels as
    decider.client opens them (round_robin over healthy replicas, UNAVAILABLE retried)."""
    tally = tally if tally is not None else Tally()
    options = channel_options(address) if balanced else None
    chans = [grpc.aio.insecure_channel(target(address), options) for _ in range(channels)]
    stubs = [pb_grpc.DeciderStub(c) for c in chans]
    end = time.monotonic() + seconds

    async def client(k: int) -> None:
        stub, i = stubs[k % len(stubs)], k
        while time.monotonic() < end and not (stop and stop.is_set()):
            i, n = i + 1, i % len(reqs)
            tally.sent += 1
            try:
                reply = await stub.Decide(reqs[n], timeout=timeout)
            except grpc.aio.AioRpcError as e:
                code, reason = e.code().name, _remote_error(e).reason  # ErrorInfo's
                tally.lost += code == "DEADLINE_EXCEEDED"
                tally.errors[(code, reason)] += code != "DEADLINE_EXCEEDED"
                if keep:
                    tally.outcomes.append((time.monotonic(), code, reason))
                await asyncio.sleep(backoff)
                continue
            tally.answered += 1
            dev = deviation(fingerprint(reply), refs[n])
            tally.mixed += dev > tol
            tally.max_dev = max(tally.max_dev, dev)
            if keep:
                tally.outcomes.append((time.monotonic(), "OK", ""))

    started = time.monotonic()
    try:
        await asyncio.gather(*(client(k) for k in range(clients)))
    finally:
        tally.seconds = time.monotonic() - started
        for c in chans:
            await c.close()
    return tally


def engine_pids(pid: int) -> list[int]:
    return roles(pid)["engine"]


def usage(pid: int) -> dict[str, dict[str, int]]:
    """RSS (kB) and open fds of the daemon and of each engine process."""
    out = {}
    for name, p in [("daemon", pid)] + [(f"engine {e}", e) for e in engine_pids(pid)]:
        status = read(f"/proc/{p}/status").decode()
        rss = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmRSS:"))
        out[name] = {"rss_kb": rss, "fds": len(os.listdir(f"/proc/{p}/fd"))}
    return out


def growth(before: dict, after: dict) -> dict[str, float]:
    """Percent growth of each measure of each process; a process replaced is inf."""
    return {f"{name} {m}": (100.0 * (after[name][m] - v) / v if name in after else float("inf"))
            for name, was in before.items() for m, v in was.items()}


async def soak(address: str, pid: int | None, *, clients: int = 64, seconds: float = 600,
               warmup: float = 60, tol: float = 0.0, channels: int = 4) -> dict:
    """References, then the load; resources sampled at `warmup` and at the end."""
    reqs = requests()
    refs = await references(address, reqs)
    samples = {}

    async def sampler() -> None:
        await asyncio.sleep(warmup)
        samples["before"] = usage(pid)
        await asyncio.sleep(max(0.0, seconds - warmup - 1))
        samples["after"] = usage(pid)

    sampling = asyncio.create_task(sampler()) if pid else None
    tally = await load(address, reqs, refs, clients=clients, seconds=seconds,
                       channels=channels, tol=tol)
    if sampling:
        await sampling
    return {"tally": tally, "requests": len(reqs), **samples,
            "growth": growth(samples["before"], samples["after"]) if pid else {}}


def make_tiny(source: Path, out: Path) -> Path:
    """tiny_model.py's tiny model of `source` at `out`, made once."""
    if not out.exists():
        from .tiny_model import write_tiny

        part = out.with_suffix(".part")
        write_tiny(str(source), str(part))
        part.rename(out)
    return out


def start_daemon(model: str, tmp: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """`decider serve --model MODEL` on a unix socket in tmp, once it is SERVING."""
    address = f"unix://{tmp}/soak.sock"
    proc = subprocess.Popen([sys.executable, "-P", "-m", "decider", "serve", "--model", model,
                             "--listen", address, *flags],
                            stdout=(tmp / "daemon.log").open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with grpc.insecure_channel(address) as ch:
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=2)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return proc, address
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the daemon did not serve:\n{(tmp / 'daemon.log').read_text()}")


def summary(report: dict, clients: int) -> str:
    t = report["tally"]
    lines = [f"{clients} clients, {t.seconds:.0f} s, {report['requests']} distinct requests: "
             f"{t.sent} sent, {t.answered} answered ({t.answered / t.seconds:.1f} req/s), "
             f"lost {t.lost}, mixed {t.mixed}, errors {dict(t.errors) or 0}, "
             f"max |p - reference| {t.max_dev:.3g}"]
    for name, b in report.get("before", {}).items():
        a = report["after"].get(name, {})
        lines.append(f"{name}: RSS {b['rss_kb']} -> {a.get('rss_kb')} kB "
                     f"({report['growth'][name + ' rss_kb']:+.2f}%), fds {b['fds']} -> "
                     f"{a.get('fds')} ({report['growth'][name + ' fds']:+.2f}%)")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("address", nargs="?", help="a running daemon (unix:///path or host:port)")
    p.add_argument("--pid", type=int, help="the running daemon's pid, to sample RSS and fds")
    p.add_argument("--model", help="start a daemon on this model (catalog name or .gguf)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--warmup", type=float, help="seconds before the first sample (10%%)")
    p.add_argument("--tol", type=float, default=0.0, help="allowed |p - reference|")
    p.add_argument("--max-growth", type=float, default=5.0, help="percent, RSS and fds")
    p.add_argument("--threads", type=int, default=1, help="with --model: engine threads (1: "
                   "llama.cpp's spinning threads collapse on a shared CPU)")
    args = p.parse_args()
    if not args.address and not args.model:
        p.error("give a daemon's address or --model")
    seconds, proc = 60 * args.minutes, None
    warmup = args.warmup if args.warmup is not None else seconds / 10
    if args.model:
        proc, args.address = start_daemon(
            args.model, Path(tempfile.mkdtemp(prefix="soak-")), "--threads", str(args.threads),
            "--max-queue", str(max(256, 2 * args.clients)))
        args.pid = proc.pid
    try:
        report = asyncio.run(soak(args.address, args.pid, clients=args.clients,
                                  seconds=seconds, warmup=warmup, tol=args.tol))
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)
    print(summary(report, args.clients))
    grew = [k for k, v in report["growth"].items() if v > args.max_growth]
    if grew:
        print(f"grew more than {args.max_growth}%: {', '.join(grew)}")
    return 0 if report["tally"].ok() and not grew else 1


if __name__ == "__main__":
    sys.exit(main())
