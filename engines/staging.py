"""A call's int32 arrays on their way to the device: one pinned host buffer, one device
buffer, each array in its own aligned region."""

from __future__ import annotations

import numpy as np
import torch

from .passes import Pass

ALIGN = 16  # 4-byte values: 64 bytes


def aligned(n: int) -> int:
    """n rounded up to a multiple of ALIGN: where a call's next region of a buffer begins,
    so that every view a kernel gets starts 64-byte aligned. Triton compiles a kernel
    anew for each alignment class of its pointers; unaligned views would make it compile
    on requests, after the warm-up."""
    return -(-n // ALIGN) * ALIGN


class Staging:
    """A pinned host buffer and a device buffer for a call's int32 arrays. Each array
    goes up by its own asynchronous copy, to its own aligned region: nothing in flight is
    overwritten within a call, and each call ends reading its results back, so none is
    in flight when the next begins."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.host = torch.empty(0, dtype=torch.int32)
        self.dev = torch.empty(0, dtype=torch.int32, device=device)
        self.at = 0

    def begin(self, n: int, regions: int) -> None:
        """Room for n int32 values this call, put in `regions` arrays (each starts aligned)."""
        n += ALIGN * regions
        if self.host.numel() < n:
            size = max(n, 2 * self.host.numel())
            self.host = torch.empty(size, dtype=torch.int32,
                                    pin_memory=self.device.type == "cuda")
            self.dev = torch.empty(size, dtype=torch.int32, device=self.device)
        self.at = 0

    def put(self, a: np.ndarray) -> torch.Tensor:
        """a on the device (a view of the device buffer, shaped as a)."""
        self.host.numpy()[self.at:self.at + a.size] = a.ravel()
        return self._send(a.size).view(a.shape)

    def put_pass(self, p: Pass) -> torch.Tensor:
        """The pass packed straight into the host buffer, then on the device."""
        return self._send(len(p.pack(out=self.host.numpy()[self.at:])))

    def _send(self, n: int) -> torch.Tensor:
        """The next n staged values, copied up."""
        at = self.at
        self.dev[at:at + n].copy_(self.host[at:at + n], non_blocking=True)
        self.at = aligned(at + n)
        return self.dev[at:at + n]
