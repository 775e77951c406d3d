"""Random quantized weights for the kernel tests, and the closeness they are held to."""

from __future__ import annotations

import torch

from decider.kernels import qmatmul as qm


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-4 * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=tol)


def random_qweight(n: int, k: int, bits: int, group: int) -> qm.QWeight:
    scale = torch.rand(n, k // group) * 0.1 + 0.01
    if bits == 4:
        codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        return qm.QWeight(codes, scale, -8 * scale + torch.randn_like(scale) * 0.01, group, 4)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    return qm.QWeight(codes, scale, None, group, 8)
