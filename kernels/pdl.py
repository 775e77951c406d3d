"""Programmatic dependent launch (Hopper and later): in a pass's chain of kernels the next
kernel's programs are scheduled while this one's finish, and wait for its results.

A pass of a few hundred tokens is ~150 kernels of a few microseconds, and the start of
each (launch, programs placed, first loads) is a large part of it. A kernel launched with
`launch_options` calls `wait_for_inputs` before its first load and `let_next_launch`
once its main loop is done: what it writes after that is still seen by the next kernel,
whose wait returns only when this whole grid has finished and its writes are visible.
Triggering after the main loop, not at the start, is what pays (a chain of 72 packed
matmuls at 128 rows in a CUDA graph, H200: 6.83-7.03 us a matmul without, 6.72-6.75
triggered at the start, 6.36-6.38 after the loop). Kernels launched the ordinary way
(torch's, cuBLAS) wait for all before them as always. Off under the Triton interpreter,
before Hopper, and with DECIDER_PDL=0.
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
    """Keyword arguments of a launch on x's device: the kernel's PDL flag, and Triton's."""
    return {"PDL": True, "launch_pdl": True} if _enabled(x.device) else {"PDL": False}


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Wait until the kernel before this one has finished and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def let_next_launch(PDL: tl.constexpr):
    """Let the next kernel's programs be scheduled (they wait for this grid's end)."""
    if PDL:
        gdc_launch_dependents()
