"""An operator's day under load (decider/bench/soak.py's load, on a daemon started here):
a client sending hostile requests, each of which must get its own refusal; a reload of a
changed config a third of the way in (a new engine swapped in: nothing may fail); the
engine process killed two thirds in (what it held is refused UNAVAILABLE, nothing is
lost, a new one serves). Exit 1 when anything else happened.

    python -m decider.bench.faults --model tiny.gguf --clients 16 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import grpc

from ..v1 import decider_pb2 as pb
from ..v1 import decider_pb2_grpc as pb_grpc
from .soak import Tally, engine_pids, load, references, requests, start_daemon, summary


def _yes_no(question: str = "Refund?") -> pb.Question:
    return pb.Question(question=question, yes_no=pb.YesNo())


# What the hostile client sends, and the status each must get back, over and over.
HOSTILE = {
    "an empty text": (pb.DecideRequest(text=" ", questions=[_yes_no()]), "INVALID_ARGUMENT"),
    "no question": (pb.DecideRequest(text="Refund?"), "INVALID_ARGUMENT"),
    "257 labels": (pb.DecideRequest(text="x", questions=[pb.Question(
        question="Which?", choice=pb.Choice(labels=[pb.Label(name=f"l{i}")
                                                    for i in range(257)]))]),
        "INVALID_ARGUMENT"),
    "over the window": (pb.DecideRequest(text="word " * 9000, questions=[_yes_no()]),
                        "OUT_OF_RANGE"),
    "an unknown model": (pb.DecideRequest(model="no-such-model", text="x",
                                          questions=[_yes_no()]), "NOT_FOUND"),
    "bytes that are no message": (b"\xff\xff\xff\xff", "INVALID_ARGUMENT"),
}


async def hostile(address: str, tally: Tally, seconds: float, timeout: float = 60) -> None:
    """Every HOSTILE request in turn until `seconds` pass, each outcome in tally.hostile."""
    end = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.DeciderStub(channel)
        raw = channel.unary_unary("/decider.v1.Decider/Decide")  # bytes as they are
        while time.monotonic() < end:
            for what, (request, _) in HOSTILE.items():
                try:
                    if isinstance(request, bytes):
                        await raw(request, timeout=timeout)
                    else:
                        await stub.Decide(request, timeout=timeout)
                    code = "OK"
                except grpc.aio.AioRpcError as e:
                    code = e.code().name
                tally.hostile.append((time.monotonic(), what, code))
                await asyncio.sleep(0.05)


async def faulted(address: str, pid: int, config: Path, *, clients: int,
                  seconds: float) -> dict:
    """The load and the hostile client, a reload of a changed config (max_batch 16 -> 8:
    a new engine process) at a third of the time, the engine process killed at two."""
    reqs = requests()
    refs = await references(address, reqs)
    events: list[tuple[float, str]] = []
    tally, started = Tally(), time.monotonic()

    async def operator() -> None:
        await asyncio.sleep(seconds / 3)
        config.write_text(config.read_text().replace("max_batch = 16", "max_batch = 8"))
        os.kill(pid, signal.SIGHUP)
        events.append((time.monotonic(), "reload"))
        await asyncio.sleep(seconds / 3)
        os.kill(engine_pids(pid)[-1], signal.SIGKILL)
        events.append((time.monotonic(), "kill"))

    await asyncio.gather(load(address, reqs, refs, clients=clients, seconds=seconds,
                              keep=True, backoff=0.2, tally=tally),
                         hostile(address, tally, seconds), operator())
    return {"tally": tally, "requests": len(reqs), "events": events, "started": started}


def unexpected(report: dict, window: float = 60.0) -> list[tuple]:
    """What went wrong: an error other than UNAVAILABLE in the `window` seconds after an
    engine was killed, a hostile request refused with another status than its own."""
    kills = [t for t, what in report["events"] if what == "kill"]

    def excused(when: float, code: str) -> bool:
        return code == "UNAVAILABLE" and any(0 <= when - k < window for k in kills)

    t = report["tally"]
    return [o for o in t.outcomes if o[1] != "OK" and not excused(o[0], o[1])] + \
        [(what, code) for when, what, code in t.hostile
         if code != HOSTILE[what][1] and not excused(when, code)]


def describe(report: dict, clients: int) -> str:
    """soak.summary's lines, the hostile requests' statuses and when each fault came."""
    t = report["tally"]
    codes = collections.Counter(code for _, _, code in t.hostile)
    return "\n".join([summary(report, clients),
                      f"hostile requests: {len(t.hostile)} tried, by status {dict(codes)}",
                      "faults: " + ", ".join(f"{what} at {when - report['started']:.0f} s"
                                             for when, what in report["events"])])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="catalog name or .gguf (tiny_model.py's)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="faults-"))
    config = tmp / "decider.toml"
    config.write_text("[server]\nmax_batch = 16\n")
    proc, address = start_daemon(args.model, tmp, "--config", str(config), "--threads", "1")
    try:
        report = asyncio.run(faulted(address, proc.pid, config, clients=args.clients,
                                     seconds=args.seconds))
    finally:
        proc.terminate()
        proc.wait(60)
    print(describe(report, args.clients))
    t = report["tally"]
    return 0 if not (t.lost or t.mixed or unexpected(report)) else 1


if __name__ == "__main__":
    sys.exit(main())
