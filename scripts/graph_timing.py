"""Time calls as the engine's CUDA graphs run them: replayed back to back in one graph,
per-call medians with no host launch cost (scripts/bench_kernels.py's sweeps)."""

from __future__ import annotations

import torch


def graph_ms(calls: list, replays: int = 10) -> float:
    """Median ms per call of `calls` replayed back to back in one CUDA graph."""
    for f in calls[:2]:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    times = []
    for _ in range(replays):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / len(calls))
    return sorted(times)[len(times) // 2]


def tile_us(calls: list) -> float:
    """Per-call us of `calls` in a graph; infinity for a tile that does not fit the chip."""
    try:
        return graph_ms(calls) * 1e3
    except Exception:  # noqa: BLE001 - out of shared memory or registers
        return float("inf")


def rank(calls_of, tiles) -> tuple[list, str]:
    """(us, tile) for each tile, fastest first (`calls_of(tile)`: the calls a graph
    replays), and the best three as text."""
    ranked = sorted((tile_us(calls_of(t)), t) for t in tiles)
    return ranked, "  ".join(f"{t} {us:.1f}" for us, t in ranked[:3])
