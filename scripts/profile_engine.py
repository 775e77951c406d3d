"""Where the Triton engine spends its time on random weights of a real Gemma 3 shape
(CUDA): one yes/no at 120 and at 2000 tokens, and 128 decisions of 256 tokens in one
call. For each: wall time, the host-side layout alone, torch.profiler's top operations
by device time, and for one job the call taken apart (`stages`). A Gemma 4 shape (QAT
Q4_0 weights) runs its targets instead: one request of 230 tokens with 5 yes/no questions
(a 185-token text and five 9-token questions, as `decider bench --prompt-tokens 230
--questions 5` builds it), and 128 of them in one call.

    python scripts/profile_engine.py [SHAPE]     # gemma-3-270m (default), gemma-3-1b,
                                                 # gemma-4-e2b, ...
"""

import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from decider.bench import random_gemma4
from decider.bench.engines import random_job
from decider.engines import ScoreJob, load_engine
from decider.engines.passes import lay_out
from decider.engines.triton_engine import N_BATCH

shape = sys.argv[1] if len(sys.argv) > 1 else "gemma-3-270m"
path = random_gemma4.write_shape(f"{tempfile.mkdtemp()}/{shape}.gguf", shape)
engine = load_engine("triton", path, 4096)
rng = np.random.default_rng(1)


def median_ms(fn, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def stages(one: ScoreJob) -> str:
    """One job's call taken apart, medians: the whole call; its layout (host); its pass's
    graph with the packed pass copied in (host launch to device end) and the replay alone
    (CUDA events around it); the head at the answer (label rows and the full-vocabulary
    logsumexp). What the call adds to their sum is host work between them."""
    graphs, model = engine._graphs, engine.model
    [p] = lay_out([one], N_BATCH["cuda"], model.cfg.window).passes
    n = graphs.bucket(p)
    packed = torch.from_numpy(p.pack()).cuda()
    rows = torch.from_numpy(graphs.padded_rows(p, n)).cuda()
    out = {"call": median_ms(lambda: engine.score([one])),
           "layout": median_ms(lambda: lay_out([one], N_BATCH["cuda"], model.cfg.window)
                               .passes[0].pack()),
           "graph": median_ms(lambda: graphs.run(packed, rows, n))}
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs.run(packed, rows, n)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    out["replay (device)"] = float(np.median(times))
    h = graphs.run(packed, rows, n)[:1].clone()
    rows = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    out["head"] = median_ms(lambda: (model.head(h, rows), model.logsumexp(h)))
    return ", ".join(f"{k} {v:.3f}" for k, v in out.items()) + " ms"


def job(n: int, questions: int = 1) -> ScoreJob:
    """n tokens after the BOS, as `decider bench` builds its jobs."""
    return random_job(rng, 1000, n, questions)


cases = ((("1 x 230 tokens, 5 questions", [job(230, 5)]),
          ("128 x 230 tokens, 5 questions", [job(230, 5) for _ in range(128)]))
         if shape in random_gemma4.SHAPES else
         (("1 x 120 tokens", [job(120)]), ("1 x 2000 tokens", [job(2000)]),
          ("128 x 256 tokens", [job(256) for _ in range(128)])))
for name, jobs in cases:
    for _ in range(3):
        engine.score(jobs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        engine.score(jobs)
    wall = (time.perf_counter() - t0) / 10
    t0 = time.perf_counter()
    for _ in range(10):
        for p in lay_out(jobs, N_BATCH["cuda"], engine.model.cfg.window).passes:
            p.pack()
    layout = (time.perf_counter() - t0) / 10
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.score(jobs)
        torch.cuda.synchronize()
    device = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
    print(f"== {name}: wall {wall * 1e3:.2f} ms per call, layout and packing "
          f"{layout * 1e3:.2f} ms, device time {device:.2f} ms (profiled call)")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    if os.environ.get("TRACE_DIR"):  # the call's timeline, host and device, for a viewer
        prof.export_chrome_trace(f"{os.environ['TRACE_DIR']}/{name.replace(' ', '')}.json")
    if len(jobs) == 1:
        with torch.inference_mode():  # the graphs' buffers are inference tensors
            print(stages(jobs[0]))
