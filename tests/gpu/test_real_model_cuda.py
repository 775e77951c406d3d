"""The Triton engine on CUDA (fp16 activations, CUDA graphs) on the real gemma-3-270m:
p_yes against the fp32 reference within the GPU bound, and against llama.cpp within the
issue's bounds, over the fixed prompt set of tests/helpers/real_prompts.py (and, against the
reference, fresh random texts), each request alone (the latency path: one graph, head
and all) and all in one call (batched passes)."""

from __future__ import annotations

import pytest
import torch

from decider import Decider, Request, YesNo
from helpers.real_prompts import (
    assert_within_llama_bounds,
    fixed_requests,
    p_yes,
    p_yes_gaps,
    words,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
# every engine reads the real file's tokenizer through llama.cpp (engines/vocab.py)
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
P_TOL = 0.02  # the GPU bound on p_yes against the fp32 reference


@pytest.fixture(scope="module")
def gpu(catalog):
    with Decider("gemma-3-270m", engine="triton", catalog=catalog, n_ctx=2048) as d:
        assert d.engine.device.type == "cuda" and d.engine.dtype == torch.float16
        yield d


@pytest.fixture(scope="module")
def reference(catalog):  # transformers, fp32, on the CPU: the oracle
    with Decider("gemma-3-270m", engine="reference", catalog=catalog, n_ctx=2048) as d:
        yield d


def test_p_yes_against_the_fp32_reference(gpu, reference, rng):
    fresh = [Request(words(rng, int(n)), (YesNo("Does the customer want money back?"),))
             for n in rng.integers(10, 600, 12)]
    requests = fixed_requests() + fresh
    want = p_yes(reference, requests, alone=False)
    for alone in (True, False):
        gaps = p_yes_gaps(p_yes(gpu, requests, alone), want)
        assert gaps.max() <= P_TOL, (alone, gaps)


def test_p_yes_against_llama_cpp_over_the_fixed_prompt_set(gpu, catalog):
    requests = fixed_requests()
    # llama.cpp with every layer on the GPU, one request per call (its logits depend on
    # how a batch is split)
    with Decider("gemma-3-270m", engine="llama", catalog=catalog, n_ctx=2048,
                 n_gpu_layers=-1) as llama:
        theirs = p_yes(llama, requests, alone=True)
    gaps = p_yes_gaps(p_yes(gpu, requests, alone=False), theirs)
    assert_within_llama_bounds(gaps)
