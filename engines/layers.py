"""What the Gemma 3 and Gemma 4 model code share: packed linears, the activation dtype,
and a text model's embedding, output head and what moves it to a device.

Weights stay packed from file to arithmetic: a `Packed` GGUF tensor becomes a `QWeight`
the kernels read as it is; dense tensors become tensors in the activation dtype (or, for
tables gathered per token, their stored precision).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from decider.kernels.fused import gelu_mul, softcap_
from decider.kernels.qmatmul import qmatmul, qmatmul_gelu, qmatmul_logsumexp
from decider.kernels.qweight import QWeight

from . import DTYPES
from .gguf_weights import Packed, Weight, same_weight


def activation_dtype(name: str) -> torch.dtype:
    """The torch dtype an engine's `dtype` option names."""
    if name not in DTYPES:
        from decider.errors import ConfigError

        raise ConfigError(f"dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, "
                          f"got {name!r}")
    return getattr(torch, name)


def qweight(w: Packed) -> QWeight:
    off = None if w.offset is None else torch.from_numpy(w.offset)
    return QWeight(torch.from_numpy(w.codes), torch.from_numpy(w.scale), off, w.group,
                   4 if w.kind == "q4" else 8)


def fp32(w: np.ndarray) -> torch.Tensor:
    """A dense GGUF tensor (a norm, a scalar) as an fp32 torch tensor."""
    return torch.from_numpy(np.array(w, np.float32))


def weight(w: Weight, dtype: torch.dtype) -> QWeight | torch.Tensor:
    """A tensor the kernels multiply: packed as it is, dense in `dtype`."""
    return qweight(w) if isinstance(w, Packed) else fp32(w).to(dtype)


def stored(w: Weight, source: str | None) -> QWeight | torch.Tensor:
    """A table gathered per token, in its stored form: packed as it is, dense in the
    precision it was stored in (source: "BF16", "F16" or "F32")."""
    if isinstance(w, Packed):
        return qweight(w)
    return fp32(w).to({"BF16": torch.bfloat16, "F16": torch.float16}.get(source, torch.float32))


def nbytes(w: QWeight | torch.Tensor) -> int:
    return w.nbytes() if isinstance(w, QWeight) else w.numel() * w.element_size()


class Linear(nn.Module):
    """y = x @ [W_1; W_2; ...].T: one projection, or several side by side (q, k, v) in one
    output; interleaved (gate, up), the rows of two alternate instead (output column 2i
    from the first, 2i + 1 from the second: fused.gelu_mul's layout, which a matmul tile
    can finish in its epilogue). Packed parts of one form are joined into one weight at
    load (one matmul); parts that differ each write their own columns."""

    def __init__(self, weights: list[Weight], dtype: torch.dtype,
                 interleave: bool = False) -> None:
        super().__init__()
        if interleave and len(weights) != 2:
            raise ValueError(f"interleaving takes two projections, got {len(weights)}")
        self.interleave = interleave
        parts = [_join(weights, interleave)] if _joinable(weights) else weights
        self.parts = [weight(w, dtype) for w in parts]
        self.out_features = sum(w.shape[0] for w in self.parts)

    def to(self, device):  # QWeight is not a module: move the parts by hand
        self.parts = [w.to(device) for w in self.parts]
        return self

    def nbytes(self) -> int:
        return sum(map(nbytes, self.parts))

    def forward(self, x: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
        """dense: the one packed part already dequantized (engines/dense_weights.py)."""
        if len(self.parts) == 1:
            return _matmul(x, self.parts[0], dense=dense)
        out = torch.empty(len(x), self.out_features, dtype=x.dtype, device=x.device)
        if self.interleave:
            pairs = out.view(len(x), -1, 2)
            for j, w in enumerate(self.parts):
                pairs[:, :, j] = _matmul(x, w)
            return out
        at = 0
        for w in self.parts:
            _matmul(x, w, out[:, at:at + w.shape[0]])
            at += w.shape[0]
        return out

    def gelu(self, x: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
        """gelu_tanh(gate) * up [T, F] of an interleaved (gate, up) projection: in the
        packed matmul's epilogue when both are one packed weight."""
        if len(self.parts) == 1 and isinstance(self.parts[0], QWeight):
            return qmatmul_gelu(x, self.parts[0], dense)
        return gelu_mul(self(x))


def _matmul(x: torch.Tensor, w: QWeight | torch.Tensor, out: torch.Tensor | None = None,
            dense: torch.Tensor | None = None):
    if isinstance(w, QWeight):
        return qmatmul(x, w, out, dense)
    return torch.matmul(x, w.T) if out is None else out.copy_(torch.matmul(x, w.T))


def _joinable(ws: list[Weight]) -> bool:
    if all(not isinstance(w, Packed) for w in ws):
        return True
    return all(isinstance(w, Packed) and (w.kind, w.group, w.scale.dtype, w.symmetric) ==
               (ws[0].kind, ws[0].group, ws[0].scale.dtype, ws[0].symmetric) for w in ws)


def _join(ws: list[Weight], interleave: bool) -> Weight:
    """One weight of the parts' rows: one part after another, or alternating."""
    if len(ws) == 1:
        return ws[0]

    def rows(arrays: list[np.ndarray]) -> np.ndarray:
        if interleave:
            return np.stack(arrays, 1).reshape(-1, *arrays[0].shape[1:])
        return np.concatenate(arrays)

    if not isinstance(ws[0], Packed):
        return rows([np.asarray(w, np.float32) for w in ws])
    offset = None if ws[0].offset is None else rows([w.offset for w in ws])
    return Packed(ws[0].kind, rows([w.codes for w in ws]), rows([w.scale for w in ws]), offset,
                  ws[0].group, "+".join(w.source for w in ws))


class TextModel(nn.Module):
    """A decoder's embedding, blocks and output head. Subclasses build `blocks` and call
    `_set_head`; the head computes fp32 logits of label rows only, softcapped where the
    model says so, and the full-vocabulary logsumexp without writing the logits."""

    embedding: QWeight | torch.Tensor
    output: QWeight | torch.Tensor
    blocks: nn.ModuleList
    # whether forward(rows=...) computes fewer tokens than the pass's (else it only
    # gathers them at the end)
    prunes_rows = False

    def __init__(self, dtype: torch.dtype, hidden: int) -> None:
        super().__init__()
        self.dtype = dtype
        # Gemma scales embeddings by sqrt(hidden), rounded to the activation dtype as in
        # transformers; the residual stream itself is kept in fp32 (the sublayers' inputs
        # and outputs are in `dtype`): bf16 rounding of the stream is the largest error
        # source otherwise, and it costs one [T, hidden] fp32 buffer
        self.embed_scale = torch.tensor(math.sqrt(hidden), dtype=dtype)
        self.softcap: float | None = None

    def _set_head(self, embedding: Weight, output: Weight | None, softcap: float | None
                  ) -> None:
        """The embedding and the output head: one weight when the head is tied, or stored
        equal to the embedding (the head then reads the embedding's packed rows)."""
        self.embedding = weight(embedding, self.dtype)
        self.output = self.embedding if output is None or same_weight(output, embedding) \
            else weight(output, self.dtype)
        self.softcap = softcap

    def to(self, device):  # QWeight is not a module: move it by hand
        super().to(device)
        for m in self.modules():
            if isinstance(m, Linear):
                m.to(device)
        tied = self.output is self.embedding
        self.embedding = self.embedding.to(device)  # packed or dense: not a module's tensor
        self.output = self.embedding if tied else self.output.to(device)
        self.embed_scale = self.embed_scale.to(device)
        self._moved(device)
        return self

    def _moved(self, device) -> None:
        """What a subclass made for its device, made again there."""

    def weight_bytes(self) -> int:
        heads = [self.embedding] + ([] if self.output is self.embedding else [self.output])
        return (sum(m.nbytes() for m in self.modules() if isinstance(m, Linear))
                + sum(map(nbytes, heads)) + sum(map(nbytes, self._tables()))
                + sum(nbytes(x) for name, x in self.named_buffers() if "norm" in name))

    def _tables(self) -> list[QWeight | torch.Tensor]:
        """Weights outside the linears, the head and the norms (Gemma 4's per-layer table)."""
        return []

    def head(self, h: torch.Tensor, rows: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """h [A, hidden] -> fp32 logits [A, len(rows)] of the output head (rows: int32,
        None for all), into `out` when given; h stays in the activation dtype, the products
        accumulate in fp32."""
        w = self.output
        n = w.shape[0] if rows is None else len(rows)
        if out is None:
            out = torch.empty(len(h), n, device=h.device)
        if isinstance(w, QWeight):
            qmatmul(h, w, out, rows=rows)
        else:
            torch.matmul(h.float(), (w if rows is None else w[rows]).float().T, out=out)
        if self.softcap:
            softcap_(out, self.softcap)
        return out

    def logsumexp(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """h [A, hidden] -> fp32 [A] (into `out` when given): logsumexp of the
        full-vocabulary logits, softcapped first where the model softcaps them."""
        if isinstance(self.output, QWeight):
            return qmatmul_logsumexp(h, self.output, out, softcap=self.softcap)
        return torch.logsumexp(self.head(h), dim=-1, out=out)
