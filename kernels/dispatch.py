"""Where the operations of this package run: the Triton kernel for a CUDA tensor, the
torch reference beside it otherwise; and the arrival counts the split Triton launches
share.

One switch for all of them, read at each call, so that a test can send CPU tensors
through the Triton kernels under TRITON_INTERPRET=1 and check whole engine passes on
them without a GPU (tests/test_kernels_triton.py).
"""

from __future__ import annotations

import torch


def triton(x: torch.Tensor) -> bool:
    return x.is_cuda


MAX_TILES = 1 << 14  # output tiles of one split launch: the arrival counts it may use
# one set of arrival counts per device, shared by every split launch (qmatmul's split-K,
# attention's split keys): launches on a device must not overlap, which holds while they
# go to its default stream (the engines' passes and graph replays do), and each leaves
# its counts zero for the next
_counts: dict[torch.device, torch.Tensor] = {}


def arrival_counts(device: torch.device) -> torch.Tensor:
    """int32 [MAX_TILES] zeros on `device`, where a split launch's programs count in."""
    count = _counts.get(device)
    if count is None:
        count = _counts[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return count
