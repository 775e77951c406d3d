"""The pass columns of columns.py in one kernel: each program a block of tokens, each
token finding its chain by a binary search over the chains' first indices."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pass_layout import FIELDS, HEADER
from .pdl import launch_options, let_next_launch, wait_for_inputs

BLOCK = 256  # tokens a program


@triton.jit
def _columns_kernel(packed_ptr, out_ptr, size, window, STEPS: tl.constexpr,
                    FIELDS: tl.constexpr, HEADER: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
    """A chain's fields at offsets 0-5: pos0, lo_full, end, before, follow, start."""
    wait_for_inputs(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(packed_ptr)
    chains = packed_ptr + HEADER + t
    real = i < t
    # token i's chain is the last one starting at or before it: start[lo] <= i < start[hi]
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.where(real, tl.load(packed_ptr + 1), 1)
    for _ in range(STEPS):  # STEPS halvings take any count of chains up to size to one
        open_ = hi - lo > 1
        mid = (lo + hi) // 2
        left = tl.load(chains + mid * FIELDS + 5, mask=open_, other=0) <= i
        lo = tl.where(open_ & left, mid, lo)
        hi = tl.where(open_ & ~left, mid, hi)
    chain = chains + lo * FIELDS
    pos0 = tl.load(chain, mask=real, other=0)
    start = tl.load(chain + 5, mask=real, other=0)
    before = tl.load(chain + 3, mask=real, other=0)
    follow = tl.load(chain + 4, mask=real, other=0)
    pos = pos0 + i - start
    oldest = pos - (window - 1)
    lo_slide = tl.where(oldest >= pos0, i - (window - 1),
                        before + tl.maximum(oldest, 0) * follow)
    # padding: id 0 at position 0, seeing only itself
    ids = tl.load(packed_ptr + HEADER + i, mask=real, other=0)
    lo_full = tl.where(real, tl.load(chain + 1, mask=real, other=0), i)
    end = tl.where(real, tl.load(chain + 2, mask=real, other=0), i + 1)
    let_next_launch(PDL)
    ok = i < size
    tl.store(out_ptr + i, ids, mask=ok)
    tl.store(out_ptr + size + i, tl.where(real, pos, 0), mask=ok)
    tl.store(out_ptr + 2 * size + i, lo_full, mask=ok)
    tl.store(out_ptr + 3 * size + i, tl.where(real, lo_slide, i), mask=ok)
    tl.store(out_ptr + 4 * size + i, end, mask=ok)


def columns_triton(packed: torch.Tensor, size: int, window: int) -> torch.Tensor:
    """columns.columns on the device: T and C are read there, so a CUDA graph can hold it
    (the caller checks T <= size and C <= T)."""
    out = torch.empty(5, size, dtype=torch.int32, device=packed.device)
    _columns_kernel[(triton.cdiv(size, BLOCK),)](
        packed, out, size, window, STEPS=size.bit_length(), FIELDS=FIELDS, HEADER=HEADER,
        BLOCK=BLOCK, num_warps=4, **launch_options(packed))
    return out
