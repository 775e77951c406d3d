"""How long one request holds the engine against its work measure (Engine.work_tokens),
for each question shape at the largest size the work bound admits.

    python scripts/work_bound.py [--bound 16384] [--n-ctx 8192] [--repeat 3]
                                 [--only NAME ...] [--size NAME=N ...] [--n-parallel 4]
                                 [--quiet 0.05]

Each shape grows with one size (the text's words, or the labels of each question) up to
the largest size whose request fits the window and the bound; the request is then
answered with the bound lifted (Decider.plan, Decider.decide_request) `repeat` times after
one warm-up, and the median is printed. --size fixes a shape's size instead of searching
(to time the same requests on another version of the engine). The machine may be shared:
only calls during which other processes stayed quiet count (`seconds`); the table gives
how many calls it took and the load average after them. Beside each request, `read once`:
llama.cpp's own Llama reading as many tokens of its prompt once, and the ratio of the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from decider import Choice, Decider, Limits, MultiLabel, Request, Scale, YesNo
from decider.errors import PromptTooLong

POOL = ("the a customer order parcel refund late broken screen price paid twice delivery "
        "support email account password login error charge card bank week store reply "
        "asked again never arrived box damaged wrong size colour return label").split()


def words(n: int, seed: int = 0) -> str:
    return " ".join(np.random.default_rng(seed).choice(POOL, n))


def long_labels(n: int) -> list[str]:
    """n labels of about ten words, distinct by their number."""
    return [f"{i} {words(9, seed=i)}" for i in range(n)]


def mixed_labels(n: int) -> list[str]:
    """Words of one token each, then labels of several ("label40"), n in all."""
    return POOL + [f"label{i}" for i in range(len(POOL), n)]


Build = Callable[[int], Request]

# name: (what the size counts, the request of that size, the largest size tried)
SHAPES: dict[str, tuple[str, Build, int]] = {
    "yes/no": ("words", lambda n: Request(words(n), (YesNo("Is a refund requested?"),)),
               20000),
    "choice, 255 labels label0..": ("words", lambda n: Request(words(n), (
        Choice("Topic?", [f"label{i}" for i in range(255)]),)), 20000),
    "choice, 255 mixed labels": ("words", lambda n: Request(words(n), (
        Choice("Topic?", mixed_labels(255)),)), 20000),
    "choice, 256 labels label0..": ("words", lambda n: Request(words(n), (
        Choice("Topic?", [f"label{i}" for i in range(256)]),)), 20000),
    "choice, 256 labels topic 0..": ("words", lambda n: Request(words(n), (
        Choice("Topic?", [f"topic {i}" for i in range(256)]),)), 20000),
    "choice, 10-word labels": ("labels", lambda n: Request(words(60), (
        Choice("Topic?", long_labels(n)),)), 256),
    "choice, 256 10-word labels": ("words", lambda n: Request(words(n), (
        Choice("Topic?", long_labels(256)),)), 20000),
    "multi-label, 256 labels": ("words", lambda n: Request(words(n), (
        MultiLabel("Which apply?", [f"label {i}" for i in range(256)]),)), 20000),
    "scale, 5 levels": ("words", lambda n: Request(words(n), (
        Scale("How urgent?", ["none", "low", "medium", "high", "critical"]),)), 20000),
    "scale, 256 levels": ("words", lambda n: Request(words(n), (
        Scale("How urgent?", [f"level {i}" for i in range(256)]),)), 20000),
    "32 yes/no questions": ("words", lambda n: Request(words(n), tuple(
        YesNo(f"Is it about {w}? ({q})") for q, w in enumerate(POOL[:32]))), 20000),
    "32 multi-label questions": ("labels", lambda n: Request(words(60), tuple(
        MultiLabel(f"Which {q}?", [f"label {i}" for i in range(n)]) for q in range(32))), 256),
    "32 choices": ("labels", lambda n: Request(words(60), tuple(
        Choice(f"Topic {q}?", [f"topic {i}" for i in range(n)]) for q in range(32))), 256),
}


def work(d: Decider, request: Request) -> int | None:
    """The request's work measure; None when it does not fit the window."""
    try:
        return d.engine.work_tokens(d.plan(request).job)
    except PromptTooLong:
        return None


def largest(d: Decider, build: Build, top: int, bound: int) -> int | None:
    """The largest size up to `top` whose request fits the window and the bound."""
    def fits(n: int) -> bool:
        w = work(d, build(n))
        return w is not None and w <= bound

    lo, hi = 2, top  # a choice needs two labels
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def others_cpu() -> float:
    """CPU seconds spent so far by every process but this one (Linux's /proc/stat)."""
    with open("/proc/stat") as f:
        jiffies = [int(v) for v in f.readline().split()[1:8]]
    busy = (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK")  # not idle
    own = os.times()
    return busy - own.user - own.system


def seconds(call: Callable[[], object], repeat: int, quiet: float) -> tuple[float, int]:
    """The median of `repeat` calls during which the other processes took at most `quiet`
    of the machine's CPU, and how many calls that took. llama.cpp's threads wait for each
    other at every step, so another process on one core slows a call several times over:
    a disturbed call is timed again after a pause."""
    call()  # warm-up: the tokenizer's cache, the pages of the weights
    times, calls = [], 0
    while len(times) < repeat and calls < 5 * repeat:
        calls += 1
        others, start = others_cpu(), time.perf_counter()
        call()
        wall = time.perf_counter() - start
        if others_cpu() - others <= quiet * wall * os.cpu_count():
            times.append(wall)
        else:
            time.sleep(30)
    return (statistics.median(times) if times else float("nan")), calls


def plain_reader(d: Decider):
    """llama-cpp-python's own Llama over the same file, context size and threads: the
    baseline of reading a prompt once (one sequence, no labels)."""
    from llama_cpp import Llama

    return Llama(d.engine.info.model_path, n_ctx=d.n_ctx, n_batch=512, swa_full=False,
                 n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(), verbose=False)


def read_once(llm, job, n: int) -> None:
    """Read n tokens of the job's prompt (its prefix, then its branches' tokens) once."""
    tokens = [*job.prefix, *(t for b in job.branches for t in (*b.suffix, *b.candidates[0]))]
    llm.reset()
    llm.eval(tokens[:n])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bound", type=int, default=Limits().max_work_tokens)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", nargs="*", default=list(SHAPES))
    p.add_argument("--size", action="append", default=[], help="NAME=N")
    p.add_argument("--n-parallel", type=int, help="the llama engine's branch sequences")
    p.add_argument("--quiet", type=float, default=0.05,
                   help="the share of the CPUs other processes may take during a timed call")
    args = p.parse_args()
    sizes = dict(s.rsplit("=", 1) for s in args.size)
    options = {"n_parallel": args.n_parallel} if args.n_parallel else {}
    with Decider("gemma-3-270m", n_ctx=args.n_ctx, limits=Limits(max_work_tokens=10**9),
                 prefix_cache_bytes=0, **options) as d:  # the bound is for a first read
        print(f"bound {args.bound}, n_ctx {args.n_ctx}, engine {d.engine.name}, "
              f"threads {os.cpu_count()}, kv {d.engine.info.memory['kv'] / 2**20:.0f} MiB")
        llm = plain_reader(d)
        print("| request | size | window tokens | work tokens | seconds | calls | load "
              "| read once | ratio |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in args.only:
            unit, build, top = SHAPES[name]
            n = int(sizes[name]) if name in sizes else largest(d, build, top, args.bound)
            if n is None:
                print(f"| {name} | refused at 2 {unit} | | {work(d, build(2)):,} | | | | | |")
                continue
            request = build(n)
            plan = d.plan(request)
            t, calls = seconds(partial(d.decide_request, request), args.repeat, args.quiet)
            load = os.getloadavg()[0]
            once, _ = seconds(partial(read_once, llm, plan.job, plan.window_tokens),
                              args.repeat, args.quiet)
            print(f"| {name} | {n} {unit} | {plan.window_tokens:,} | "
                  f"{d.engine.work_tokens(plan.job):,} | {t:.1f} | {calls} | {load:.2f} | "
                  f"{once:.1f} | {t / once:.2f} |", flush=True)


if __name__ == "__main__":
    main()
