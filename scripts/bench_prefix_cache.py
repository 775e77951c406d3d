"""The prefix cache's effect, measured side by side in one run (docs/benchmarks.md, "The
prefix cache"):

- latency: states of --tokens prompt tokens, each asked by a model loaded without a
  cache (a fresh read) and, after one request about it, by a model with one (the state
  read from the cache), with a new yes/no question and with a choice of 8 options:
  medians over --states states and their ratios;
- daemon: `decider serve` started twice, with its cache and with --no-prefix-cache;
  --clients concurrent clients each asking --questions yes/no questions, one request
  after another, about one of --distinct states of --daemon-tokens tokens: each
  daemon's throughput and their ratio.

    python scripts/bench_prefix_cache.py [--part latency|daemon|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decider import Choice, Decider, YesNo
from decider.bench.daemon import QUESTIONS, WORDS
from decider.client import AsyncDeciderClient
from decider.questions import Request

LABELS = ["refund", "delivery", "billing", "login", "damage", "price", "account", "other"]


def state(i: int, tokens: int, tokenize) -> str:
    """A text of about `tokens` prompt tokens, different for every i."""
    rng = random.Random(i)
    words = [rng.choice(WORDS) for _ in range(tokens)]
    while len(tokenize(" ".join(words))) > tokens:
        words = words[: len(words) * 15 // 16]
    return " ".join(words)


def timed(decider: Decider, text: str, question) -> float:
    t0 = time.perf_counter()
    decider.decide(text, [question])
    return time.perf_counter() - t0


def latency(model: str, n_ctx: int, tokens: int, states: int, engine: str | None) -> None:
    with Decider(model, engine=engine, n_ctx=n_ctx, prefix_cache_bytes=0) as fresh, \
            Decider(model, engine=engine, n_ctx=n_ctx) as cached:
        texts = [state(i, tokens, fresh.engine.tokenize) for i in range(states)]
        prefix = len(fresh.plan(Request(texts[0], (YesNo(QUESTIONS[1]),))).job.prefix)
        choice = Choice("What is the message about?", LABELS)
        rows = {"yes/no": ([], []), "choice of 8": ([], [])}
        for text in texts:
            cached.decide(text, [YesNo(QUESTIONS[0])])  # the first request about it
            for name, question in (("yes/no", YesNo(QUESTIONS[1])), ("choice of 8", choice)):
                rows[name][0].append(timed(fresh, text, question))
                rows[name][1].append(timed(cached, text, question))
        print(f"{model}, {os.cpu_count()} threads, prefix {prefix} tokens, medians of "
              f"{states} states")
        print("| question | fresh read s | from the cache s | ratio |")
        print("|---|---|---|---|")
        for name, (cold, warm) in rows.items():
            a, b = statistics.median(cold), statistics.median(warm)
            print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.1f}x |")


async def drive(address: str, texts: list[str], clients: int, questions: int) -> float:
    """Requests/s of `clients` clients each asking `questions` questions about one text."""
    async with AsyncDeciderClient(address, timeout=3600) as client:
        async def one(c: int) -> None:
            for q in range(questions):
                await client.decide(texts[c % len(texts)], [YesNo(QUESTIONS[q % 4])])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(c) for c in range(clients)))
        return clients * questions / (time.perf_counter() - t0)


def serve(model: str, n_ctx: int, address: str, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "decider", "serve", "--model", model,
                             "--n-ctx", str(n_ctx), "--listen", address, *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while subprocess.run([sys.executable, "-m", "decider", "health", address],
                         capture_output=True).returncode:
        if proc.poll() is not None:
            sys.exit(f"decider serve {' '.join(flags)} exited {proc.returncode}")
        time.sleep(1)
    return proc


def daemon(model: str, n_ctx: int, tokens: int, distinct: int, clients: int,
           questions: int, engine: str | None, daemons: str) -> None:
    with Decider(model, engine=engine, n_ctx=n_ctx, prefix_cache_bytes=0) as d:
        texts = [state(1000 + i, tokens, d.engine.tokenize) for i in range(distinct)]
    rates = {}
    chosen = ("--engine", engine) if engine else ()
    with tempfile.TemporaryDirectory() as tmp:
        address = f"unix://{Path(tmp) / 'decider.sock'}"
        for name, flags in (("no cache", ("--no-prefix-cache",)), ("cache", ())):
            if daemons not in ("both", name):
                continue
            proc = serve(model, n_ctx, address, *chosen, *flags)
            try:
                rates[name] = asyncio.run(drive(address, texts, clients, questions))
            finally:
                proc.terminate()
                proc.wait()
    print(f"daemon, {clients} clients x {questions} yes/no requests about {distinct} states "
          f"of ~{tokens} tokens")
    print("| daemon | requests/s |")
    print("|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.2f} |")
    if len(rates) == 2:
        print(f"ratio {rates['cache'] / rates['no cache']:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m", help="a catalog name or a file")
    p.add_argument("--engine", help="the engine (default: the daemon's choice)")
    p.add_argument("--part", choices=["latency", "daemon", "both"], default="both")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--states", type=int, default=5)
    p.add_argument("--daemon-tokens", type=int, default=1000)
    p.add_argument("--distinct", type=int, default=16)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--daemons", choices=["both", "no cache", "cache"], default="both",
                   help="which daemons to measure (the Triton engine on CUDA caches only "
                        "prefixes of 2,048 tokens or more: for shorter states there one is "
                        "enough)")
    args = p.parse_args()
    if args.part in ("latency", "both"):
        latency(args.model, args.n_ctx, args.tokens, args.states, args.engine)
    if args.part in ("daemon", "both"):
        daemon(args.model, args.n_ctx, args.daemon_tokens, args.distinct, args.clients,
               args.questions, args.engine, args.daemons)


if __name__ == "__main__":
    main()
