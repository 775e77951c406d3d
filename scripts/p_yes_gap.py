"""The worst p_yes gap of the Triton engine against the fp32 reference, per activation
dtype, on tiny random Gemma 3 models (those of tests/gpu/test_triton_engine_cuda.py):
one model and 30 prompts per seed, seeds 0..N-1.

    python scripts/p_yes_gap.py [N] [device]      # device: cuda (default) or cpu
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu"))
from test_triton_engine_cuda import VOCAB, WINDOW, jobs, p_yes

from decider.bench.random_gguf import write_tiny_gemma3
from decider.engines import load_engine

seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
worst: dict[str, list[float]] = {"float16": [], "bfloat16": []}
for seed in range(seeds):
    path = Path(tempfile.mkdtemp()) / "tiny.gguf"
    write_tiny_gemma3(path, np.random.default_rng(seed), window=WINDOW, vocab=VOCAB)
    batch = jobs(np.random.default_rng(100 + seed), 30)
    reference = load_engine("reference", path, 512)
    want = reference.score(batch)
    reference.close()
    for dtype, gaps in worst.items():
        engine = load_engine("triton", path, 512, device=device, dtype=dtype)
        gaps.append(max(abs(p_yes(j, g) - p_yes(j, w))
                        for j, g, w in zip(batch, engine.score(batch), want, strict=True)))
        engine.close()
for dtype, gaps in worst.items():
    print(f"{dtype:9} worst p_yes gap per seed: " + " ".join(f"{g:.4f}" for g in gaps))
