"""The next layer's weights dequantized on a side stream while this layer runs.

A pass of LARGE_M rows or more multiplies each layer's weights dequantized (cuBLAS, or
the gelu epilogue on the dense copy: kernels/qmatmul_triton.py). Dequantizing is a
memory-bound kernel per weight, and a layer's attention and fused steps leave the GPU
room beside them, so the copies for layer i + 1 are made on a second stream while layer
i runs, into the other of two buffer sets; events order the two streams (also inside a
CUDA graph, where they become its edges). The weights stay packed at rest: the buffers
hold two layers' worth, in the activation dtype.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from decider.kernels.qweight import QWeight

LINEARS = ("qkv", "o", "gate_up", "down", "ple_gate", "ple_proj")


class DenseWeights:
    """Made for a model's blocks where their weights will run (after moving them)."""

    def __init__(self, blocks: torch.nn.ModuleList, dtype: torch.dtype) -> None:
        # per layer, the linears that are one packed weight (others dequantize on demand)
        self._weights = [{name: getattr(b, name).parts[0] for name in LINEARS
                          if _single_packed(getattr(b, name, None))} for b in blocks]
        self.dtype = dtype
        self._buffers: list[dict[str, torch.Tensor]] = []
        self._stream: torch.cuda.Stream | None = None

    def wanted(self, rows: list[int], device: torch.device) -> list[dict[str, QWeight]]:
        """Per layer, the packed weights it multiplies dequantized on `device` at its
        `rows` rows (kernels/qmatmul_triton.py's `takes_dense`), by linear name."""
        if device.type != "cuda":
            return [{} for _ in self._weights]
        from decider.kernels.qmatmul_tiles import takes_dense

        return [{name: w for name, w in ws.items() if takes_dense(m, w, self.dtype)}
                for ws, m in zip(self._weights, rows, strict=True)]

    def layers(self, rows: list[int], device: torch.device
               ) -> Iterator[dict[str, torch.Tensor]]:
        """Per layer in order, {linear name: its dense weight} for those that take the
        dense path at the layer's rows (rows[i]; none: empty), ready on the current
        stream when yielded. The caller must run the layer's work on the current stream
        before taking the next."""
        wanted = self.wanted(rows, device)
        return self._ahead(wanted) if any(wanted) else iter(wanted)

    def _ahead(self, wanted: list[dict[str, QWeight]]) -> Iterator[dict[str, torch.Tensor]]:
        from decider.kernels.qmatmul_triton import dequantize_triton

        main = torch.cuda.current_stream()
        if self._stream is None:
            self._stream = torch.cuda.Stream(main.device)
            # two sets, one buffer per linear and shape (Gemma 4's differ by layer kind)
            shapes = {(name, w.shape) for ws in self._weights for name, w in ws.items()}
            self._buffers = [{key: torch.empty(key[1], dtype=self.dtype, device=main.device)
                              for key in shapes} for _ in range(2)]
        side = self._stream

        def fill(i: int) -> torch.cuda.Event:
            """Layer i's copies into set i % 2 on the side stream, once the main stream
            is done with that set (the layer two back)."""
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for name, w in wanted[i].items():
                    dequantize_triton(w, self.dtype, out=self._buffers[i % 2][name, w.shape])
                return side.record_event()

        # layers that multiply nothing dequantized (a pruned pass's shared layers) take no
        # fork and join: each would be a graph edge that no kernel can start early across
        ready = fill(0) if wanted[0] else None
        for i in range(len(wanted)):
            # the last fill's wait also joins the side stream, which has no work after it
            # (a CUDA graph's capture must end with every forked stream joined)
            if ready is not None:
                main.wait_event(ready)
            ready = fill(i + 1) if i + 1 < len(wanted) and wanted[i + 1] else None
            yield {name: self._buffers[i % 2][name, w.shape] for name, w in wanted[i].items()}


def _single_packed(linear) -> bool:
    return linear is not None and len(linear.parts) == 1 and isinstance(linear.parts[0], QWeight)
