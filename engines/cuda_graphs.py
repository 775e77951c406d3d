"""The model's forward captured as CUDA graphs at load, one per power-of-two token count.

A pass of a few hundred tokens is a few hundred small kernels; launched one by one from
Python the host is the bottleneck, replayed as one graph it is not. A pass is padded up
to the next captured size with tokens that see only themselves, and its metadata is
copied into that graph's input buffer before the replay. The graphs share one memory
pool (captured largest first), since they never run at the same time.
"""

from __future__ import annotations

import torch

from .passes import Pass

SMALLEST = 64


class GraphRunner:
    def __init__(self, model: torch.nn.Module, max_tokens: int, device: torch.device) -> None:
        self.sizes = [SMALLEST << i for i in range(max(max_tokens // SMALLEST, 1).bit_length())]
        self._meta = {n: torch.from_numpy(Pass(1).meta(n)).to(device)  # all padding
                      for n in self.sizes}
        self._out: dict[int, torch.Tensor] = {}
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        free_before = torch.cuda.mem_get_info(device)[0]
        pool = None
        for n in reversed(self.sizes):
            side = torch.cuda.Stream(device)  # warm-up (Triton compiles) off the capture
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                model(self._meta[n])
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._out[n] = model(self._meta[n])
            pool = graph.pool()
            self._graphs[n] = graph
        torch.cuda.synchronize(device)
        self.nbytes = max(free_before - torch.cuda.mem_get_info(device)[0], 0)

    def bucket(self, tokens: int) -> int | None:
        """The smallest captured size holding `tokens`, or None past the largest."""
        return next((n for n in self.sizes if n >= tokens), None)

    def run(self, meta: torch.Tensor) -> torch.Tensor:
        """meta [5, n] on the device, n a captured size -> hidden [n, hidden] (the graph's
        own output buffer: read it before the next run)."""
        n = meta.shape[1]
        self._meta[n].copy_(meta)
        self._graphs[n].replay()
        return self._out[n]
