"""The model's forward captured as CUDA graphs at load, one per power-of-two token count,
each followed by a small graph of the output head.

A pass of a few hundred tokens is a few hundred small kernels; launched one by one from
Python the host is the bottleneck, replayed as one graph it is not. A pass is padded up
to the next captured size with tokens that see only themselves: its packed chains are
copied into that graph's input buffer before the replay, and the graph's first kernel
expands them into the columns the model reads (kernels/columns.py). The graphs share one
memory pool (captured largest first), since they never run at the same time.

With a prefix cache, a pass that reads it (a job's branches after its restored prefix,
the hit path) replays a graph of its own too: one per token size up to READ_LARGEST and
per number of cache slots read, a power of two from READ_SLOTS up to the context, the
smallest holding the cache's filled length (kv_cache.py's `first`: the rest are masked).
Counts below the shortest prefix the cache keeps are never read, so never captured. So
does a pass that writes it (a chunk of a prefix the cache saves or extends, the stride's
tokens or its last few): one per slot count and per size from the stride's down to an
eighth of it (WRITE_SPAN), its padding written to a slot no read sees.

Each graph returns the hidden states of the pass's output rows alone, up to a fixed
number per size (its room, which `padded_rows` fills by repeating the last row): a model
whose later layers compute only those tokens (Gemma 4's KV-shared layers) does that
inside the graph; one that prunes nothing gathers them at the end, with a room of the
whole size. A pruning model's sizes are captured twice: with a room of n / ROW_SHARE
rows, and for the head graphs' passes with HEAD_ROWS (those layers' matmuls cost with
the rows they compute: docs/experiments.md, Gemma 4).

A call of one pass with few answer rows and label rows (a handful of questions about one
text, the latency case) also runs its head from a graph: the hidden states at up to
HEAD_ROWS rows, the logits of up to HEAD_LABELS label rows there and the
full-vocabulary logsumexp at each, into one buffer the host reads back whole and picks
its values from. The rows, the head's label rows and the pass go up in one copy.
"""

from __future__ import annotations

import numpy as np
import torch

from decider.kernels.columns import FIELDS, HEADER, columns

from .kv_cache import CacheSlots, KVCache
from .passes import Pass

SMALLEST = 64
# Past this many tokens a pass runs eagerly: its kernels take long enough on the GPU for
# the host's launches to keep ahead, and a graph would hold its activations for good
LARGEST = 8192
HEAD_ROWS = 16  # one row tile of the logsumexp's matmul: its cost does not grow below it
HEAD_LABELS = 64
HEAD_VALUES = HEAD_ROWS * HEAD_LABELS + HEAD_ROWS  # logits [rows, labels], then logsumexps
# A pruning model's graph of n tokens computes n / ROW_SHARE rows in its pruned layers
# (at least HEAD_ROWS); a pass with more rows takes a larger graph or runs eagerly
ROW_SHARE = 8
# the read graphs: a hit's pass holds its questions' branches, tens of tokens; the slots
# read are a power of two past the prefix, at most twice its attention's work
READ_LARGEST = 256
READ_SLOTS = 1024
WRITE_SPAN = 8  # the write graphs' sizes: the stride's, and down to this fraction of it


class _Captured:
    """A forward of n tokens computing `room` rows, and its head, captured as two graphs,
    with what they read: per call, the rows, the head's label rows and the pass packed,
    copied from a pinned host buffer into one device buffer."""

    def __init__(self, model: torch.nn.Module, n: int, room: int, values: torch.Tensor,
                 pool, cache: CacheSlots | None = None, write: bool = False) -> None:
        self.room, device = room, values.device
        # int32: the rows, the head's label rows, then the pass packed (at most a chain a
        # token)
        self.host = torch.zeros(room + HEAD_LABELS + HEADER + (1 + FIELDS) * n,
                                dtype=torch.int32, pin_memory=True)
        Pass(1).pack(out=self.host.numpy()[room + HEAD_LABELS:])  # all padding
        self.inputs = inputs = self.host.to(device)
        rows, labels, packed = inputs.split([room, HEAD_LABELS, len(inputs) - room - HEAD_LABELS])
        window = model.cfg.window
        side = torch.cuda.Stream(device)  # warm-up (Triton compiles) off the capture
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            _head(model, model(columns(packed, n, window), cache, write, rows), labels, values)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph, self.head = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = model(columns(packed, n, window), cache, write, rows)
        with torch.cuda.graph(self.head, pool=self.graph.pool()):
            _head(model, self.out, labels, values)


    def replay(self, packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The forward on a pass packed and its rows, both on the device."""
        self.inputs[:len(rows)].copy_(rows)
        at = self.room + HEAD_LABELS
        self.inputs[at:at + len(packed)].copy_(packed)
        self.graph.replay()
        return self.out


class GraphRunner:
    def __init__(self, model: torch.nn.Module, max_tokens: int, device: torch.device,
                 cache: KVCache | None = None, stride: int = 1) -> None:
        """cache: the engine's KV cache, when a prefix cache reads and writes it (the read
        and write graphs); stride: that cache's shortest prefix and chunk size."""
        top = min(max_tokens, LARGEST)
        self.sizes = [SMALLEST << i for i in range(max(top // SMALLEST, 1).bit_length())]
        self._room = {n: max(HEAD_ROWS, n // ROW_SHARE) if model.prunes_rows else n
                      for n in self.sizes}
        # what the head graphs write: logits [HEAD_ROWS, HEAD_LABELS], then logsumexps
        self.values = torch.zeros(HEAD_VALUES, device=device)
        free_before = torch.cuda.mem_get_info(device)[0]
        self._graphs: dict[int, _Captured] = {}
        # a pass the head graphs finish has at most HEAD_ROWS rows: a pruning model's own
        # graphs compute just those in its pruned layers, not the size's wider room
        self._with_head: dict[int, _Captured] = {}
        pool = None
        for n in reversed(self.sizes):
            self._graphs[n] = wide = _Captured(model, n, self._room[n], self.values, pool)
            pool = wide.graph.pool()
            self._with_head[n] = wide if not model.prunes_rows or wide.room == HEAD_ROWS \
                else _Captured(model, n, HEAD_ROWS, self.values, pool)
        chunk = next((n for n in self.sizes if n >= stride), 0)  # a whole chunk's size
        # the sizes of the passes through the cache, by Pass.cache
        self._through_cache = {} if cache is None else {
            "read": [n for n in self.sizes if n <= READ_LARGEST],
            "write": [n for n in self.sizes if chunk // WRITE_SPAN <= n <= chunk]}
        self._cached: dict[tuple[str, int, int], _Captured] = {}  # (kind, size, slots)
        self._slots = [] if cache is None else _slot_counts(stride, cache.n_ctx)
        for slots in reversed(self._slots):
            for kind, sizes in self._through_cache.items():
                for n in reversed(sizes):
                    self._cached[kind, n, slots] = _Captured(
                        model, n, self._room[n], self.values, pool, cache.first(slots),
                        kind == "write")
        if cache is not None:
            cache.clear()  # of what the write graphs' warm-ups wrote
        torch.cuda.synchronize(device)
        self.nbytes = max(free_before - torch.cuda.mem_get_info(device)[0], 0)

    def bucket(self, p: Pass) -> int | None:
        """The smallest captured size holding p's tokens and rows, or None past them all
        (for a pass through the cache: of the graphs of its kind)."""
        sizes = self._through_cache.get(p.cache, []) if p.cache else self.sizes
        return next((n for n in sizes if p.tokens <= n and self._room[n] >= len(p.rows)),
                    None)

    def padded_rows(self, p: Pass, n: int) -> np.ndarray:
        """int32 [the room of size n]: p's rows, then its last repeated (computing a token
        twice is harmless; a far one would widen its query block's keys)."""
        return _padded(p, self._room[n])

    def run(self, packed: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
        """A pass packed (passes.py) and its `padded_rows`, on the device, padded to n, a
        captured size -> the hidden states [room, hidden] at those rows (the graph's own
        output buffer: read it before the next run)."""
        return self._graphs[n].replay(packed, rows)

    def run_cached(self, kind: str, packed: torch.Tensor, rows: torch.Tensor, n: int,
                   filled: int) -> torch.Tensor:
        """As `run`, for a pass that reads the cache's first `filled` positions and, of
        kind "write", writes its tokens after them."""
        slots = next(s for s in self._slots if s >= filled)
        return self._cached[kind, n, slots].replay(packed, rows)

    def run_with_head(self, p: Pass, labels: list[int]) -> None:
        """One pass and its head into `values`: at the pass's rows (at most HEAD_ROWS),
        label rows `labels` (at most HEAD_LABELS). The pinned buffer is free: every call
        ends reading its values back, so no copy from it is in flight."""
        g = self._with_head[self.bucket(p)]
        host, room = g.host.numpy(), g.room
        host[:room] = _padded(p, room)
        host[room:room + len(labels)] = labels
        host[room + len(labels):room + HEAD_LABELS] = 0
        used = room + HEAD_LABELS + len(p.pack(out=host[room + HEAD_LABELS:]))
        g.inputs[:used].copy_(g.host[:used], non_blocking=True)
        g.graph.replay()
        g.head.replay()


def _slot_counts(shortest: int, n_ctx: int) -> list[int]:
    """READ_SLOTS and its doubles below n_ctx, then n_ctx, from the one holding `shortest`
    on: every filled length from `shortest` to n_ctx has one."""
    counts = [READ_SLOTS << i for i in range(n_ctx.bit_length()) if READ_SLOTS << i < n_ctx]
    counts.append(n_ctx)
    return counts[next(i for i, c in enumerate(counts) if c >= shortest):]


def _padded(p: Pass, room: int) -> np.ndarray:
    """int32 [room]: p's rows, then its last repeated."""
    out = np.full(room, p.rows[-1] if p.rows else 0, np.int32)
    out[:len(p.rows)] = p.rows
    return out


def _head(model: torch.nn.Module, h: torch.Tensor, labels: torch.Tensor, out: torch.Tensor
          ) -> None:
    """out: the logits [HEAD_ROWS, HEAD_LABELS] of label rows `labels` at h's first
    HEAD_ROWS rows, then the logsumexp at each of those rows."""
    at = h[:HEAD_ROWS]
    model.head(at, labels, out=out[:HEAD_ROWS * HEAD_LABELS].view(HEAD_ROWS, HEAD_LABELS))
    model.logsumexp(at, out=out[HEAD_ROWS * HEAD_LABELS:])
