"""The engine's KV cache for one sequence: full-attention layers one slot per position,
sliding-window layers a ring of `window` slots (position p in slot p % window). A layer
that reads another's keys and values (Gemma 4's KV-shared layers) has no cache at all.

Writes go by the tokens' positions on the device, with no host sync, so that a CUDA
graph can hold a pass that writes (cuda_graphs.py): a graph's padding tokens (columns.py:
position 0 past index 0) land in one spare slot past the layer's own, which no read
sees."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Layout = list[tuple[bool, int, int] | None]  # per layer (sliding, kv heads, head dim), or None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A copy of the cache's filled slots, on its device: what the prefix cache keeps."""

    length: int
    slots: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]  # k, v, pos a layer

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for kvp in self.slots if kvp for t in kvp)


class KVCache:
    def __init__(self, layout: Layout, n_ctx: int, window: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.n_ctx = n_ctx
        self.slots = [0 if spec is None else min(window, n_ctx) if spec[0] else n_ctx
                      for spec in layout]
        self.ring = [spec is not None and spec[0] for spec in layout]
        self.k = [None if spec is None else  # the spare slot last
                  torch.zeros(n + 1, spec[1], spec[2], dtype=dtype, device=device)
                  for n, spec in zip(self.slots, layout, strict=True)]
        self.v = [None if k is None else torch.zeros_like(k) for k in self.k]
        self.pos = [None if k is None else torch.full((len(k),), -1, dtype=torch.int32,
                                                      device=device) for k in self.k]
        self.length = 0  # positions held so far (the same in every layer)

    def nbytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k in self.k if k is not None)

    def clear(self) -> None:
        for p in self.pos:
            if p is not None:
                p.fill_(-1)
        self.length = 0

    def read(self, layer: int, slots: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V [n, Hkv, D] and positions [n] of the filled slots (of the first `slots`,
        filled or not, where given)."""
        if self.k[layer] is None:
            raise ValueError(f"layer {layer} has no cache of its own")
        n = min(self.length if slots is None else slots, self.slots[layer])
        return self.k[layer][:n], self.v[layer][:n], self.pos[layer][:n]

    def first(self, n: int) -> CacheSlots:
        """The first n slots of every layer (a ring's all), filled or not: what a CUDA graph
        reads, whose shapes cannot follow self.length. Empty slots hold position -1, which
        attention masks, so any n from self.length on reads the same prefix."""
        return CacheSlots(self, n)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Store tokens at their positions `pos` (int32 [t]: consecutive from self.length,
        then any padding); a ring keeps the newest token of each slot."""
        n = self.slots[layer]
        if self.k[layer] is None:
            raise ValueError(f"layer {layer} has no cache of its own")
        kept = (pos > 0) | (torch.arange(len(pos), device=pos.device) == 0)  # not padding
        if self.ring[layer]:  # nor overwritten by a later token of this write
            kept &= pos > pos.max() - n
        # n: the spare slot (check_windows keeps positions inside a full layer's slots)
        slot = torch.where(kept, pos % n if self.ring[layer] else pos, n).long()
        for cache, values in ((self.k, k), (self.v, v), (self.pos, pos)):
            cache[layer].index_copy_(0, slot, values)

    def snapshot(self) -> Snapshot:
        """A copy of every filled slot: restored, the cache is as it is now, bit for bit
        (a ring's slots in the same places)."""
        return Snapshot(self.length, [None if k is None else tuple(
            t[:min(self.length, self.slots[i])].clone() for t in (k, self.v[i], self.pos[i]))
            for i, k in enumerate(self.k)])

    def restore(self, snapshot: Snapshot) -> None:
        """The cache as it was when `snapshot` was taken."""
        self.clear()
        for i, kvp in enumerate(snapshot.slots):
            if kvp is not None:
                n = len(kvp[0])
                self.k[i][:n], self.v[i][:n], self.pos[i][:n] = kvp
        self.length = snapshot.length

    def advance(self, t: int) -> None:
        """After every layer wrote the same t tokens."""
        self.length += t


class CacheSlots:
    """KVCache.first(n): a cache read at a fixed number of slots."""

    def __init__(self, cache: KVCache, n: int) -> None:
        self.cache, self.n = cache, n

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cache.read(layer, self.n)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        self.cache.write(layer, k, v, pos)
