"""The torch engine on CUDA (Triton qmatmul) against the transformers reference on tiny
random Gemma 3 GGUFs: fp32 within the CPU path's 1e-3, bf16 within 0.02 in p_yes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decider.engines import Branch, ScoreJob, load_engine
from decider.engines.random_gguf import write_tiny_gemma3

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
WINDOW, VOCAB = 16, 384
P_TOL = 0.02  # the GPU bound on p_yes; bf16 activations, fp32 head
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "m.gguf"
    write_tiny_gemma3(path, np.random.default_rng(), window=WINDOW, vocab=VOCAB)
    out = {"ref": load_engine("reference", path, 512),
           "fp32": load_engine("triton", path, 512, device="cuda", dtype="float32"),
           # passes of at most 40 tokens: longer jobs go through the KV cache in chunks
           "fp32-chunked": load_engine("triton", path, 512, device="cuda", dtype="float32",
                                       n_batch=40),
           "bf16": load_engine("triton", path, 512, device="cuda")}
    yield out
    for e in out.values():
        e.close()


def jobs(rng, n: int) -> list[ScoreJob]:
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 3 * WINDOW + 5))
        ids = [int(t) for t in rng.integers(3, VOCAB, length + 6)]
        yes, no = (int(t) for t in rng.choice(np.arange(3, VOCAB), 2, replace=False))
        out.append(ScoreJob((2, *ids[:length]), (Branch(tuple(ids[length:]), ((yes,), (no,))),)))
    return out


def p_yes(job: ScoreJob, result) -> float:
    """Softmax over the two labels at the answer position; the first label is yes."""
    [[root]] = result
    p = np.exp(root.logits.astype(np.float64) - root.logits.max())
    return float(p[root.token_ids.index(job.branches[0].candidates[0][0])] / p.sum())


@pytest.mark.parametrize("name", ["fp32", "fp32-chunked"])
def test_fp32_on_cuda_matches_the_reference(engines, name):
    """12 jobs in one call: packed into one pass replayed from a CUDA graph, or (chunked)
    several passes through the KV cache."""
    batch = jobs(np.random.default_rng(), 12)
    ref = engines["ref"].score(batch)
    got = engines[name].score(batch)
    for (g,), (r,) in zip(got, ref):
        np.testing.assert_allclose(g[0].logits, r[0].logits, atol=1e-3)
        assert g[0].logsumexp == pytest.approx(r[0].logsumexp, abs=1e-3)


def assert_p_yes_close(engine, reference) -> None:
    """30 fresh prompts: p_yes within P_TOL, the same decision away from a tie."""
    batch = jobs(np.random.default_rng(), 30)
    worst = 0.0
    for j, g, r in zip(batch, engine.score(batch), reference.score(batch), strict=True):
        pg, pr = p_yes(j, g), p_yes(j, r)
        worst = max(worst, abs(pg - pr))
        if abs(pr - 0.5) >= NEAR_TIE:
            assert (pg >= 0.5) == (pr >= 0.5)
    assert worst <= P_TOL, worst


def test_bf16_on_cuda_keeps_p_yes_within_0_02_and_the_decisions(engines):
    assert_p_yes_close(engines["bf16"], engines["ref"])
