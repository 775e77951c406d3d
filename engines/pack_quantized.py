"""compressed-tensors "pack-quantized" int4 linears in Packed form, exactly.

`weight_packed` int32 [N, K/8], eight 4-bit fields per word, lowest first, each the
signed code q plus 8; `weight_scale` [N, K/group]; asymmetric: `weight_zero_point` int32
[ceil(N/8), K/group], packed the same way down the rows (zp + 8); value = (q - zp) * s.
The little-endian words' bytes are exactly Packed's q4 codes (column 2k low nibble of
byte k, 2k+1 high), u = q + 8, so value = (u - 8) * s (symmetric: the scale alone is kept,
in fp16 where that holds it exactly, as it does every bf16 scale of normal size) or
u * s + offset with offset = -(zp + 8) * s. The products are exact in fp32 for bf16/fp16
scales (at most 11 + 4 significant bits); fp32 scales are checked and refused where
k * s would round for some 4-bit k.
"""

from __future__ import annotations

import numpy as np

from .gguf_weights import Packed
from .safetensors_file import SafeTensor


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [..., W] -> the eight 4-bit fields of each word, lowest first: [..., W * 8]."""
    w = words.astype(np.int64) & 0xFFFFFFFF
    return ((w[..., None] >> (4 * np.arange(8))) & 15).reshape(*w.shape[:-1], -1)


class PackQuantized:
    """One pack-quantized linear's tensors, checked against its scheme."""

    def __init__(self, module: str, parts: dict[str, SafeTensor], weights: dict) -> None:
        self.module, self.weights = module, weights
        self.symmetric = weights.get("symmetric", True)
        missing = {"weight_packed", "weight_scale", "weight_shape"} - parts.keys()
        if not self.symmetric:
            missing |= {"weight_zero_point"} - parts.keys()
        if missing:
            raise ValueError(f"pack-quantized module {module!r} lacks {', '.join(sorted(missing))}")
        if self.symmetric and "weight_zero_point" in parts:
            raise ValueError(f"{module}.weight_zero_point is stored for a symmetric scheme")
        shape = tuple(int(x) for x in parts["weight_shape"].ints())
        if len(shape) != 2:
            raise ValueError(f"{module}.weight_shape is {shape}; expected [rows, cols]")
        self.rows, self.cols = shape
        self.group = weights["group_size"] if weights["strategy"] == "group" else self.cols
        self.packed, self.scale_t = parts["weight_packed"], parts["weight_scale"]
        self.zero_t = parts.get("weight_zero_point")
        if self.packed.dtype != "I32" or self.packed.shape != (self.rows, self.cols // 8) or \
                self.cols % 8 or self.cols % self.group:
            raise ValueError(f"{module}.weight_packed is {self.packed.dtype} {self.packed.shape}; "
                             f"expected I32 [{self.rows}, {self.cols} / 8] in groups of "
                             f"{self.group}")
        self.scale = self.scale_t.float32()
        if self.scale.shape != (self.rows, self.cols // self.group):
            raise ValueError(f"{module}.weight_scale is {self.scale.shape}; expected "
                             f"[{self.rows}, {self.cols // self.group}]")
        if self.zero_t is not None and (self.zero_t.dtype != "I32" or self.zero_t.shape != (
                -(-self.rows // 8), self.scale.shape[1])):
            raise ValueError(f"{module}.weight_zero_point is {self.zero_t.dtype} "
                             f"{self.zero_t.shape}; expected I32 [ceil({self.rows} / 8), "
                             f"{self.scale.shape[1]}]")

    def zero_codes(self) -> np.ndarray:
        """The unsigned zero point zp + 8 per group, [rows, groups] (8: symmetric)."""
        if self.zero_t is None:
            return np.full(self.scale.shape, 8, np.int64)
        z = _nibbles(self.zero_t.data.T)  # [groups, ceil(rows / 8) * 8]: down the rows
        return z[:, : self.rows].T

    def packed_form(self) -> Packed:
        s = self.scale
        # bf16/fp16 scales hold at most 11 significant bits, so k * s (k < 16) is exact in
        # fp32; fp32 scales are checked
        if self.scale_t.dtype == "F32" and not all(
                np.array_equal((np.float32(k) * s).astype(np.float64), k * s.astype(np.float64))
                for k in range(3, 16, 2)):  # odd k suffice: k = 2^j * odd only shifts
            raise ValueError(f"{self.module}.weight_scale (F32) has scales whose 4-bit "
                             "multiples round in fp32: not held exactly")
        codes = self.packed.data.view(np.uint8).reshape(self.rows, self.cols // 2)
        src = f"W4A16-g{self.group}{'' if self.symmetric else '-asym'}"
        if self.symmetric:  # (u - 8) * s; a bf16 scale that fp16 holds exactly is kept so
            half = s.astype(np.float16)
            exact = np.array_equal(half.astype(np.float32), s)
            return Packed("q4", codes, half if exact else s, None, self.group, src)
        offset = -(self.zero_codes().astype(np.float32) * s)  # exact: checked just above
        return Packed("q4", codes, s, offset, self.group, src)

    def dense(self) -> np.ndarray:
        """fp32 [rows, cols]: compressed-tensors' own decompression where it is installed
        (scales upcast to fp32, so its arithmetic is exact), else the format's formula
        from the int32 words; neither goes through the Packed layout."""
        try:
            import torch
            from compressed_tensors.compressors.pack_quantized.base import (
                PackedQuantizationCompressor,
            )
            from compressed_tensors.quantization import QuantizationScheme
        except ImportError:
            q = _nibbles(self.packed.data).astype(np.float64) - 8  # signed codes
            zp = self.zero_codes().astype(np.float64) - 8
            w = (q.reshape(self.rows, -1, self.group) - zp[..., None]) * self.scale[..., None]
            return w.reshape(self.rows, self.cols).astype(np.float32)
        sd = {"weight_packed": torch.from_numpy(self.packed.data),
              "weight_scale": torch.from_numpy(self.scale),
              "weight_shape": torch.tensor([self.rows, self.cols])}
        if self.zero_t is not None:
            sd["weight_zero_point"] = torch.from_numpy(self.zero_t.data)
        scheme = QuantizationScheme(targets=["Linear"], weights=self.weights)
        w = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
        return w.to(torch.float32).numpy()
