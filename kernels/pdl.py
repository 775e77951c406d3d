"""Programmatic dependent launch (Hopper and later): a kernel of a pass starts while the
one before it finishes, and waits for it (its results in memory) before its first load.

A pass of a few hundred tokens is ~150 small kernels, each a few microseconds, of which
the launch of the next is a large part: with this the next kernel's programs are already
resident when the previous one ends. Every kernel launched this way calls
`wait_for_inputs` first; kernels launched the ordinary way (torch's, cuBLAS) wait as
usual. Off under the Triton interpreter, before Hopper, and with DECIDER_PDL=0.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.cache
def _enabled(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" \
            or os.environ.get("DECIDER_PDL") == "0":
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def launch_options(x: torch.Tensor) -> dict:
    """Keyword arguments of a launch on x's device: the kernel's PDL flag and Triton's."""
    on = _enabled(x.device)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Wait for the kernel before this one, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
