"""A pass's per-token columns, expanded from its chains: torch reference.

The engine describes a pass to the device by its chains (engines/passes.py, Pass.pack):
int32 [T, C, the T token ids, then per chain its FIELDS], a chain being consecutive
tokens each the parent of the next. `columns` expands that into the rows the model
reads, int32 [5, size]: ids, positions, and the (lo, end) bounds of attention.py for
full and sliding layers; tokens past T pad the pass to `size` (a captured graph's),
id 0 at position 0, each seeing only itself. On the GPU one kernel does it
(columns_triton.py), inside the CUDA graph: the host writes the ids and six values a
chain instead of five values a token.

A chain's fields: pos0 (its first token's position), lo_full and end (shared by its
tokens), before and follow (where a token whose window reaches back past pos0 looks:
in-pass index `before` plus, if follow, its oldest visible position, the prefix chain
being laid out from `before`; else `before` itself), start (its first token's index).
"""

from __future__ import annotations

import torch

from . import dispatch
from .pass_layout import END, FIELDS, HEADER, IDS, LO_FULL, LO_SLIDE, POS, START

__all__ = ["END", "FIELDS", "HEADER", "IDS", "LO_FULL", "LO_SLIDE", "POS", "columns"]


def columns(packed: torch.Tensor, size: int, window: int) -> torch.Tensor:
    """packed int32 [HEADER + T + FIELDS * C (or more)] -> int32 [5, size] on its device;
    size >= T (the caller knows T: its pass). No host sync on the GPU."""
    if packed.dim() != 1 or packed.dtype != torch.int32 or not packed.is_contiguous():
        raise ValueError(f"packed must be contiguous int32 [n], got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    if size < 1 or window < 1:
        raise ValueError(f"size and window must be positive, got {size} and {window}")
    if dispatch.triton(packed):
        from .columns_triton import columns_triton  # Triton only where it runs

        return columns_triton(packed, size, window)
    t, c = int(packed[0]), int(packed[1])
    if t > size or len(packed) < HEADER + t + FIELDS * c:
        raise ValueError(f"{t} tokens and {c} chains do not fit size {size} and "
                         f"{len(packed)} packed values")
    chains = packed[HEADER + t:HEADER + t + FIELDS * c].view(c, FIELDS)
    lengths = torch.diff(chains[:, START], append=torch.tensor([t], dtype=torch.int32))
    pos0, lo_full, end, before, follow, start = chains.repeat_interleave(lengths, 0).T
    index = torch.arange(t, dtype=torch.int32)
    out = torch.empty(5, size, dtype=torch.int32)
    out[IDS, :t] = packed[HEADER:HEADER + t]
    out[POS, :t] = pos = pos0 + index - start
    out[LO_FULL, :t] = lo_full
    oldest = pos - (window - 1)  # inside the chain: index - (window - 1)
    out[LO_SLIDE, :t] = torch.where(oldest >= pos0, index - (window - 1),
                                    before + oldest.clamp(min=0) * follow)
    out[END, :t] = end
    padding = torch.arange(t, size, dtype=torch.int32)
    out[IDS, t:] = out[POS, t:] = 0
    out[LO_FULL, t:] = out[LO_SLIDE, t:] = padding
    out[END, t:] = padding + 1
    return out
