"""The tensors of a .safetensors file, read without the safetensors library: a u64 header
length, a JSON header of dtype, shape and byte range per tensor, then the data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8",
              "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class SafeTensor:
    """One safetensors tensor: its dtype name and little-endian data (bf16 as uint16)."""

    __slots__ = ("data", "dtype", "name")

    def __init__(self, name: str, dtype: str, data: np.ndarray) -> None:
        self.name, self.dtype, self.data = name, dtype, data

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def float32(self) -> np.ndarray:
        """fp32, exactly (bf16, fp16 and fp32 all fit); other dtypes are refused."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << 16).view(np.float32)
        if self.dtype in ("F16", "F32"):
            return self.data.astype(np.float32)
        raise ValueError(f"tensor {self.name!r} is {self.dtype}; expected BF16, F16 or F32")

    def ints(self) -> np.ndarray:
        if self.dtype not in ("I32", "I64"):
            raise ValueError(f"tensor {self.name!r} is {self.dtype}; expected I32 or I64")
        return self.data.astype(np.int64)


def read_safetensors(path: Path) -> dict[str, SafeTensor]:
    """Every tensor of one .safetensors file (the format is a u64 header length, a JSON
    header of dtype, shape and byte range, then the data), copied out of a memory map."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    header = json.loads(raw[8 : 8 + n].tobytes())
    base = 8 + n
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r} in {path.name} has dtype {spec['dtype']}, "
                             "which this reader does not know")
        lo, hi = spec["data_offsets"]
        data = raw[base + lo : base + hi].copy().view(_ST_DTYPES[spec["dtype"]])
        out[name] = SafeTensor(name, spec["dtype"], data.reshape(spec["shape"]))
    return out
