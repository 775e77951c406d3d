"""Where one yes/no on a random gemma-3-270m-shaped model spends its time (CUDA):
torch.profiler's top operations by device and host time, for the next optimisation."""

import tempfile

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from decider.engines import Branch, ScoreJob, load_engine
from decider.engines.random_gguf import Q4_K_M, SHAPES, write_tiny_gemma3

path = f"{tempfile.mkdtemp()}/g270m.gguf"
write_tiny_gemma3(path, np.random.default_rng(0), types=Q4_K_M, **SHAPES["gemma-3-270m"])
engine = load_engine("triton", path, 4096)
ids = np.random.default_rng(1).integers(5, 1000, 120).tolist()
job = ScoreJob((2, *ids[:111]), (Branch(tuple(ids[111:]), ((3,), (4,))),))
for _ in range(3):
    engine.score([job])
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    engine.score([job])
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))
