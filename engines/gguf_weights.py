"""GGUF tensors kept packed: quantized codes and group scales mapped exactly, no requantising.

Two packed forms, each dequantizing as `code * scale [+ offset]` in fp32, bit for bit what
gguf's own dequantize gives:
- q4: 4-bit codes, two per byte (column 2k in the low nibble of byte k, 2k+1 in the
  high), with a per-group scale and offset (Q4_1: groups of 32; Q4_K: its 8 sub-blocks
  of 32, the two-level scales folded into fp32, where both products are exact), or
  symmetric, (code - 8) * scale with no offset stored (Q4_0: its fp16 scale as it is).
- q8: signed 8-bit codes with a per-group scale (Q5_0 and Q8_0: 32, their fp16 scales as
  they are; Q6_K: 16, the super-block scale folded into fp32). Q5_0's 5-bit codes and
  Q6_K's 6-bit ones, offset to be signed, fit int8 exactly.
Scales are fp16 where the source's are (exact, and half the bytes read), else fp32.
Dense tensors (F32, F16, BF16) stay dense. Numpy only: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
QK_K = 256


@dataclass(frozen=True, slots=True)
class Packed:
    kind: str  # "q4" | "q8"
    codes: np.ndarray  # q4: uint8 [rows, cols // 2]; q8: int8 [rows, cols]
    scale: np.ndarray  # float32 or float16 [rows, cols // group]
    offset: np.ndarray | None  # float32 [rows, cols // group]; q4 with an offset only
    group: int
    source: str  # the GGML type it came from

    def __post_init__(self) -> None:
        rows, cols = self.shape
        want = {"q4": (np.uint8, cols // 2), "q8": (np.int8, cols)}.get(self.kind)
        if want is None or self.codes.dtype != want[0] or self.codes.shape[1] != want[1]:
            raise ValueError(f"bad {self.kind} codes {self.codes.dtype} {self.codes.shape}")
        if self.scale.dtype not in (np.float32, np.float16) or \
                self.scale.shape != (rows, cols // self.group):
            raise ValueError(f"scale {self.scale.dtype} {self.scale.shape} does not fit "
                             f"{rows}x{cols}/{self.group} in fp32 or fp16")
        if (self.kind == "q8" and self.offset is not None) or (
            self.offset is not None and (self.offset.shape != self.scale.shape
                                         or self.offset.dtype != np.float32)
        ):
            raise ValueError("an offset is fp32 of the scale's shape, for q4 tensors only")

    @property
    def symmetric(self) -> bool:
        """A q4 tensor without an offset: (code - 8) * scale."""
        return self.kind == "q4" and self.offset is None

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[0], self.scale.shape[1] * self.group

    def dequantize(self) -> np.ndarray:
        """fp32 [rows, cols]: the reference the kernels are checked against."""
        rows, cols = self.shape
        if self.kind == "q4":
            q = np.stack([self.codes & 15, self.codes >> 4], -1).reshape(rows, -1, self.group)
        else:
            q = self.codes.reshape(rows, -1, self.group)
        w = (q.astype(np.float32) - 8 * self.symmetric) * self.scale.astype(np.float32)[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.reshape(rows, cols)


Weight = Packed | np.ndarray  # np.ndarray: a dense F32/F16/BF16 tensor, as stored


def same_weight(a: Weight, b: Weight) -> bool:
    """Whether two tensors are the same values in the same form (a head equal to the
    embedding shares its codes)."""
    if isinstance(a, Packed) != isinstance(b, Packed):
        return False
    if not isinstance(a, Packed):
        return np.array_equal(a, b)
    return (a.kind, a.group) == (b.kind, b.group) and all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.codes, b.codes), (a.scale, b.scale), (a.offset, b.offset)))


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16).astype(np.float32)[..., 0]


def _half(b: np.ndarray) -> np.ndarray:
    """A block's fp16 scale field, kept fp16."""
    return b.copy().view(np.float16)[..., 0]


def _nibbles(b: np.ndarray) -> np.ndarray:
    """[..., n] bytes -> [..., 2, n]: low nibbles, then high."""
    return np.stack([b & 15, b >> 4], -2)


def _q4(codes: np.ndarray, scale, offset, rows: int, group: int, src: str) -> Packed:
    c = codes.reshape(rows, -1)
    return Packed("q4", (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8),
                  scale.reshape(rows, -1), None if offset is None else offset.reshape(rows, -1),
                  group, src)


def _q8(codes: np.ndarray, scale, rows: int, group: int, src: str) -> Packed:
    return Packed("q8", codes.reshape(rows, -1).astype(np.int8), scale.reshape(rows, -1), None,
                  group, src)


def _q4_0(b, rows):  # [n, 18]: d, 16 bytes (element j low, j + 16 high): (q - 8) * d
    return _q4(_nibbles(b[:, 2:]), _half(b[:, :2]), None, rows, 32, "Q4_0")


def _q4_1(b, rows):  # [n, 20]: d, m, 16 bytes
    return _q4(_nibbles(b[:, 4:]), _f16(b[:, :2]), _f16(b[:, 2:4]), rows, 32, "Q4_1")


def _q4_k(b, rows):  # [n, 144]: d, dmin, 12 bytes of 6-bit scales/mins, 4 x 32 bytes
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, m = gguf.quants.Q4_K.get_scale_min(b[:, 4:16])
    codes = _nibbles(b[:, 16:].reshape(-1, 4, 32))  # 64 elements per 32 bytes
    # d * sc and dmin * m are exact in fp32 (11 x 6 bits), so the fold loses nothing
    scale = d[:, None] * sc.astype(np.float32)
    return _q4(codes, scale, -(dmin[:, None] * m.astype(np.float32)), rows, 32, "Q4_K")


def _q5_0(b, rows):  # [n, 22]: d, 32 high bits, 16 bytes of low nibbles
    hi = (b[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
    q = _nibbles(b[:, 6:]).reshape(-1, 32) | (hi.astype(np.uint8) << 4)
    return _q8(q.astype(np.int16) - 16, _half(b[:, :2]), rows, 32, "Q5_0")


def _q8_0(b, rows):  # [n, 34]: d, 32 int8
    return _q8(b[:, 2:].view(np.int8), _half(b[:, :2]), rows, 32, "Q8_0")


def _q6_k(b, rows):  # [n, 210]: 128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8, d
    ql = _nibbles(b[:, :128].reshape(-1, 2, 64)).reshape(-1, 8, 32)
    qh = ((b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)
           .reshape(1, 1, 4, 1)) & 3).reshape(-1, 8, 32)
    q = (ql | (qh << 4)).astype(np.int16) - 32
    # d * scale is exact in fp32 (11 x 8 bits)
    scale = _f16(b[:, 208:210])[:, None] * b[:, 192:208].view(np.int8).astype(np.float32)
    return _q8(q, scale, rows, 16, "Q6_K")


_PACKERS = {T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q4_K: _q4_k, T.Q5_0: _q5_0, T.Q8_0: _q8_0,
            T.Q6_K: _q6_k}
_DENSE = (T.F32, T.F16, T.BF16)


def _dense(raw: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype == T.BF16:  # the reader gives its bytes; bf16 -> fp32 is exact
        return (np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(raw)


def pack(raw: np.ndarray, qtype: gguf.GGMLQuantizationType, rows: int, name: str) -> Weight:
    """A tensor's raw GGUF bytes [rows, bytes per row] in packed (or dense) form."""
    if qtype in _DENSE:
        return _dense(raw, qtype)
    packer = _PACKERS.get(qtype)
    if packer is None:
        supported = ", ".join(t.name for t in (*_DENSE, *_PACKERS))
        raise ValueError(f"tensor {name!r} has GGML type {qtype.name}, which this engine cannot "
                         f"hold exactly; supported: {supported}")
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return packer(np.ascontiguousarray(raw).reshape(-1, size), rows)


@dataclass(frozen=True, slots=True)
class GGUFModel:
    path: Path
    arch: str
    # metadata key -> scalar, string, or a list (per-layer values; the tokenizer's arrays
    # are left out)
    meta: dict[str, object]
    tensors: dict[str, Weight]
    # the stored type of each dense tensor ("F32", "F16", "BF16"): what a table gathered
    # per token is kept in
    dtypes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path, dense: bool = False) -> GGUFModel:
        """Packed tensors; dense: every tensor dequantized to fp32 by gguf itself."""
        reader = gguf.GGUFReader(str(path))
        meta = {}
        for key, f in reader.fields.items():
            if len(f.types) == 1 or not key.startswith("tokenizer."):
                meta[key] = f.contents()
        tensors, dtypes = {}, {}
        for t in reader.tensors:
            rows = int(np.prod(t.shape[1:]))  # ggml shape is [cols, rows, ...]
            if dense:
                w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            else:
                w = pack(t.data, t.tensor_type, rows, t.name)
            tensors[t.name] = w
            if t.tensor_type in _DENSE:
                dtypes[t.name] = t.tensor_type.name
        return cls(Path(path), str(meta["general.architecture"]), meta, tensors, dtypes)
