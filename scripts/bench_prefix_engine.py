"""The prefix cache's effect on one engine alone (docs/benchmarks.md, "The prefix cache"):
random weights of a real shape, token ids for text. For each prefix length, a fresh read
(an engine without a cache) beside the first, second, third and fourth job about one
prefix with a cache, each a new question (yes/no, the fourth a choice of 8): medians over
--states prefixes and the ratios of a fresh read to a read from the cache. The Triton
engine saves a prefix the second time it sees it (engines/prefix_routes.py), llama.cpp
the first time.

    python scripts/bench_prefix_engine.py --engine triton --shape gemma-4-e2b \\
        --lengths 1000 2000 4000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from decider.bench.random_gemma4 import write_shape
from decider.engines import Branch, ScoreJob, load_engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="triton")
    p.add_argument("--shape", default="gemma-3-270m")
    p.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 4000])
    p.add_argument("--states", type=int, default=5)
    p.add_argument("--stride", type=int, help="the Triton engine's prefix_stride")
    p.add_argument("--n-ctx", type=int, help="the context loaded (default: the longest "
                   "prefix and 64)")
    args = p.parse_args()
    path = write_shape(Path(tempfile.mkdtemp()) / f"{args.shape}.gguf", args.shape)
    n_ctx = args.n_ctx or max(args.lengths) + 64
    options = {"prefix_stride": args.stride} if args.stride else {}
    t0 = time.perf_counter()
    fresh = load_engine(args.engine, path, n_ctx)
    t1 = time.perf_counter()
    cached = load_engine(args.engine, path, n_ctx, prefix_cache_bytes=None, **options)
    t2 = time.perf_counter()
    graphs = [e.info.memory.get("graphs", 0) / 2**20 for e in (fresh, cached)]
    print(f"n_ctx {n_ctx}: loaded in {t1 - t0:.1f} s without a cache, {t2 - t1:.1f} s "
          f"with (graphs {graphs[0]:.0f} and {graphs[1]:.0f} MiB)")
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1000, 200_000, n))

    def job(prefix: tuple[int, ...], labels: int) -> ScoreJob:
        return ScoreJob(prefix, (Branch(ids(12), tuple((t,) for t in ids(labels))),))

    def ms(engine, j: ScoreJob) -> float:
        t0 = time.perf_counter()
        [result] = engine.score([j])
        assert not isinstance(result, Exception), result
        return 1e3 * (time.perf_counter() - t0)

    for warm in (job(ids(64), 2), job(ids(64), 8)):  # compiles before anything is timed
        fresh.score([warm])
        cached.score([warm])
    print(f"{args.engine} engine, {args.shape} random weights, medians of {args.states} "
          f"prefixes (ms)")
    print("| prefix tokens | fresh yes/no | fresh choice of 8 | 1st | 2nd | 3rd | 4th, "
          "choice of 8 | yes/no ratio | choice ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        rows = []
        for _ in range(args.states):
            prefix = (2, *ids(n - 1))
            row = [ms(fresh, job(prefix, 2)), ms(fresh, job(prefix, 8))]
            row += [ms(cached, job(prefix, 2)) for _ in range(3)] + [ms(cached, job(prefix, 8))]
            rows.append(row)
        m = [statistics.median(c) for c in zip(*rows, strict=True)]
        print(f"| {n} | " + " | ".join(f"{v:.2f}" for v in m)
              + f" | {m[0] / m[4]:.1f}x | {m[1] / m[5]:.1f}x |")
    print(f"cache: {cached.prefix_cache.stats}")


if __name__ == "__main__":
    main()
