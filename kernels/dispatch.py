"""Where the operations of this package run: the Triton kernel for a CUDA tensor, the
torch reference beside it otherwise.

One switch for all of them, read at each call, so that a test can send CPU tensors
through the Triton kernels under TRITON_INTERPRET=1 and check whole engine passes on
them without a GPU (tests/test_kernels_triton.py).
"""

from __future__ import annotations

import torch


def triton(x: torch.Tensor) -> bool:
    return x.is_cuda
