"""A packed quantized weight as the kernels read it (qmatmul.py's torch reference and
qmatmul_triton.py's kernels both take it; neither owns it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class QWeight:
    codes: torch.Tensor  # bits 4: uint8 [N, K // 2]; bits 8: int8 [N, K]
    scale: torch.Tensor  # fp32 or fp16 [N, K // group]
    # fp32 [N, K // group], bits 4 only; None for 4 bits: symmetric, (code - 8) * scale
    offset: torch.Tensor | None
    group: int
    bits: int

    def __post_init__(self) -> None:
        n, k = self.shape
        dtype, width = {4: (torch.uint8, k // 2), 8: (torch.int8, k)}[self.bits]
        if self.codes.dtype != dtype or tuple(self.codes.shape) != (n, width):
            raise ValueError(f"{self.bits}-bit codes must be {dtype} [{n}, {width}], got "
                             f"{self.codes.dtype} {tuple(self.codes.shape)}")
        if self.scale.dtype not in (torch.float32, torch.float16) or (
                self.bits == 8 and self.offset is not None):
            raise ValueError("scales are fp32 or fp16; only 4-bit weights have an offset")

    @property
    def symmetric(self) -> bool:
        """4-bit codes without an offset: (code - 8) * scale."""
        return self.bits == 4 and self.offset is None

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[0], self.scale.shape[1] * self.group

    def rows(self, index: torch.Tensor | slice) -> QWeight:
        """The packed weight of a subset of output rows (label rows of a head)."""
        off = None if self.offset is None else self.offset[index]
        return QWeight(self.codes[index], self.scale[index], off, self.group, self.bits)

    def to(self, device: torch.device | str) -> QWeight:
        off = None if self.offset is None else self.offset.to(device)
        return QWeight(self.codes.to(device), self.scale.to(device), off, self.group, self.bits)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.codes, self.scale, self.offset) if t is not None)
