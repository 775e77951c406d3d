"""The engine's KV cache for one sequence: full-attention layers one slot per position,
sliding-window layers a ring of `window` slots (position p in slot p % window)."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, sliding: list[bool], n_ctx: int, window: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.slots = [min(window, n_ctx) if s else n_ctx for s in sliding]
        self.ring = list(sliding)
        self.k = [torch.zeros(n, kv_heads, head_dim, dtype=dtype, device=device)
                  for n in self.slots]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.pos = [torch.full((n,), -1, dtype=torch.int32, device=device) for n in self.slots]
        self.length = 0  # positions held so far (the same in every layer)

    def nbytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k in self.k)

    def clear(self) -> None:
        for p in self.pos:
            p.fill_(-1)
        self.length = 0

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V [n, Hkv, D] and positions [n] of the filled slots."""
        n = min(self.length, self.slots[layer])
        return self.k[layer][:n], self.v[layer][:n], self.pos[layer][:n]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the next len(k) positions (from self.length on); a ring keeps the last."""
        n, t = self.slots[layer], len(k)
        if not self.ring[layer] and self.length + t > n:
            raise ValueError(f"cache holds {n} positions; cannot write {self.length + t}")
        keep = min(t, n)
        first = self.length + t - keep
        pos = torch.arange(first, first + keep, dtype=torch.int32, device=k.device)
        slot = pos % n
        self.k[layer][slot], self.v[layer][slot], self.pos[layer][slot] = k[-keep:], v[-keep:], pos

    def advance(self, t: int) -> None:
        """After every layer wrote the same t tokens."""
        self.length += t
