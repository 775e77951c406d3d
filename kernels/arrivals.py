"""Arrival counts for kernels whose programs split one output tile's work (split-K
matmuls, split-key attention): each part counts itself in, and the last to arrive
combines the parts and resets its count to zero for the next launch.

One set per device, zeroed once. Launches that use them must not overlap on a device,
which holds while they go to its default stream (the engines' passes and graph replays
do).
"""

from __future__ import annotations

import torch

SLOTS = 1 << 14  # tiles (or query blocks) one launch may split
_counts: dict[torch.device, torch.Tensor] = {}


def counts(device: torch.device) -> torch.Tensor:
    """The device's int32 [SLOTS] counts, all zero between launches."""
    c = _counts.get(device)
    if c is None:
        c = _counts[device] = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    return c
