"""Where the Triton engine spends its time on a random gemma-3-270m-shaped model (CUDA):
one yes/no at 120 and at 2000 tokens, and 128 decisions of 256 tokens in one call. For
each: wall time, the host-side layout alone, the profiled call's timeline (host time
before the first device operation, the device's busy time and its gaps, host time after
the last one) and torch.profiler's top operations by device time."""

import json
import tempfile
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from decider.engines import Branch, ScoreJob, load_engine
from decider.engines.passes import plan
from decider.engines.random_gguf import Q4_K_M, SHAPES, write_tiny_gemma3
from decider.engines.torch_engine import N_BATCH

path = f"{tempfile.mkdtemp()}/g270m.gguf"
write_tiny_gemma3(path, np.random.default_rng(0), types=Q4_K_M, **SHAPES["gemma-3-270m"])
engine = load_engine("triton", path, 4096)
rng = np.random.default_rng(1)


def timeline(prof) -> str:
    """One profiled score call: where its wall time went, from the trace's timestamps."""
    trace = f"{tempfile.mkdtemp()}/trace.json"
    prof.export_chrome_trace(trace)
    events = json.load(open(trace))["traceEvents"]
    call = next(e for e in events if e.get("name") == "score" and e.get("cat") ==
                "user_annotation")
    device = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy = sum(end - start for start, end in device)
    span = device[-1][1] - device[0][0]
    gaps = [(b[0] - a[1], i) for i, (a, b) in enumerate(zip(device, device[1:]), 1)]
    widest, at = max(gaps, default=(0, 0))
    return (f"timeline (us): host before the first device op {device[0][0] - call['ts']:.0f}, "
            f"device span {span:.0f} (busy {busy:.0f}, gaps {span - busy:.0f}, the widest "
            f"{widest:.0f} before op {at} of {len(device)}), host after the last "
            f"{call['ts'] + call['dur'] - device[-1][1]:.0f}")


def job(n: int) -> ScoreJob:
    ids = rng.integers(5, 1000, n).tolist()
    return ScoreJob((2, *ids[:n - 9]), (Branch(tuple(ids[n - 9:]), ((3,), (4,))),))


for name, jobs in (("1 x 120 tokens", [job(120)]), ("1 x 2000 tokens", [job(2000)]),
                   ("128 x 256 tokens", [job(256) for _ in range(128)])):
    for _ in range(3):
        engine.score(jobs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        engine.score(jobs)
    wall = (time.perf_counter() - t0) / 10
    t0 = time.perf_counter()
    for _ in range(10):
        for p in plan(jobs, N_BATCH["cuda"], engine.model.cfg.window).passes:
            p.meta()
    layout = (time.perf_counter() - t0) / 10
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("score"):
            engine.score(jobs)
        torch.cuda.synchronize()
    device = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
    print(f"== {name}: wall {wall * 1e3:.2f} ms per call, layout and columns "
          f"{layout * 1e3:.2f} ms, device time {device:.2f} ms (profiled call)")
    print(timeline(prof))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
