"""The Triton engine's prefix cache, on tiny random Gemma 3 and Gemma 4 models (CPU, fp32):
a prefix seen once is read in packed passes, seen again it is saved, and from then on
read from the cache. A job read from a saved prefix is bit-equal to the job that saved it
(the same chunks through the KV cache), and every answer, cached or not, stays within the
engine's tolerance of the reference: for prefixes ending before, at and past the sliding
window and the stride, one extending a saved prefix, the ring wrapped. The cache holds its
budget and a faulted call keeps nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decider.bench.random_gemma4 import write_gemma4
from decider.bench.random_gguf import write_tiny_gemma3
from decider.engines import ScoreJob, load_engine
from decider.engines.prefix_routes import PrefixRouter
from helpers.gemma4_models import CONFIGS
from helpers.seeds import seeded
from helpers.tiny import TOL, VOCAB, WINDOW, max_diff, rand_branch, rand_ids

STRIDE, N_CTX = 24, 256  # chunks of 24 tokens: not a multiple of the window (16)
LENGTHS = [STRIDE, WINDOW * 2 - 1, WINDOW * 2, WINDOW * 2 + 1, 2 * STRIDE, 2 * STRIDE + 1,
           WINDOW * 9 + 3]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(scope="module", params=["gemma3", "gemma4"])
def models(request, device, tmp_path_factory):
    """(the engine with a cache, one without, the reference) on a tiny random model; fp32
    on either device."""
    path = tmp_path_factory.mktemp("prefix") / f"{request.param}.gguf"
    rng = seeded(f"prefix-cache[{request.param}]")
    if request.param == "gemma3":
        write_tiny_gemma3(path, rng, window=WINDOW, vocab=VOCAB)
    else:  # E2B's layout: KV-shared layers, which keep no cache of their own
        write_gemma4(path, rng, window=WINDOW, vocab=VOCAB, **CONFIGS["e2b-like"])
    cached = load_engine("triton", path, N_CTX, device=device, dtype="float32", n_batch=64,
                         prefix_cache_bytes=2**26, prefix_stride=STRIDE)
    fresh = load_engine("triton", path, N_CTX, device=device, dtype="float32", n_batch=64)
    reference = load_engine("reference", path, N_CTX)
    yield cached, fresh, reference
    for e in (cached, fresh, reference):
        e.close()


def job_of(rng, length: int, questions: int = 2) -> ScoreJob:
    return ScoreJob((2, *rand_ids(rng, length - 1)),
                    tuple(rand_branch(rng, int(rng.integers(1, 5))) for _ in range(questions)))


def assert_bit_equal(got, want) -> None:
    for gb, wb in zip(got, want, strict=True):
        for a, b in zip(gb, wb, strict=True):
            assert (a.path, a.token_ids) == (b.path, b.token_ids)
            assert np.array_equal(a.logits, b.logits), (a.path, a.logits - b.logits)
            assert a.logsumexp == b.logsumexp


@pytest.mark.parametrize("length", LENGTHS)
def test_a_prefix_asked_again_is_read_from_the_cache(models, rng, length):
    cached, fresh, reference = models
    job = job_of(rng, length)
    [first], [second], [third] = (cached.score([job]) for _ in range(3))
    assert (first.cached_tokens, second.cached_tokens, third.cached_tokens) == (0, 0, length)
    assert_bit_equal(third, second)  # read from the state the second call saved
    [want] = reference.score([job])
    [packed] = fresh.score([job])
    for got in (first, second, third, packed):
        assert max_diff(got, want) < TOL


@pytest.mark.parametrize(("saved", "extended"), [(STRIDE + 5, 4 * STRIDE), (3 * STRIDE, 150),
                                                 (WINDOW * 9 + 3, N_CTX - 20)])
def test_a_prefix_extending_a_saved_one_starts_from_its_last_stride(models, rng, saved,
                                                                    extended):
    cached, _, reference = models
    first = job_of(rng, saved, 1)
    job = ScoreJob(first.prefix + rand_ids(rng, extended - saved), job_of(rng, 2).branches)
    cached.score([first])
    cached.score([first])  # saved: at its last multiple of the stride, and whole
    [got] = cached.score([job])
    # its saved lengths that are multiples of the stride, which the longer prefix looks up
    assert got.cached_tokens == max(n for n in ((saved - 1) // STRIDE * STRIDE, saved)
                                    if n % STRIDE == 0)
    [want] = reference.score([job])
    assert max_diff(got, want) < TOL


def test_jobs_of_one_call_mix_packed_routed_and_cached(models, rng):
    """A call of jobs seen for the first, second and third time, and short ones: each
    answer where it would be alone."""
    cached, _, reference = models
    seen_twice, seen_once = job_of(rng, 70), job_of(rng, 90)
    cached.score([seen_twice])
    cached.score([seen_twice, seen_once])
    jobs = [job_of(rng, 10), seen_twice, seen_once, job_of(rng, 100), job_of(rng, 5)]
    results = cached.score(jobs)
    assert [r.cached_tokens for r in results] == [0, 70, 0, 0, 0]
    for got, want in zip(results, reference.score(jobs), strict=True):
        assert max_diff(got, want) < TOL


def test_the_cache_holds_its_budget_and_drops_the_least_recently_used(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gemma3(path, rng, window=WINDOW, vocab=VOCAB)
    probe = load_engine("triton", path, N_CTX, device="cpu", prefix_cache_bytes=2**30,
                        prefix_stride=STRIDE)
    job = job_of(rng, 100)
    probe.score([job, job])
    size = probe.prefix_cache.stats.bytes  # a 100-token state, its 96-token one beside it
    engine = load_engine("triton", path, N_CTX, device="cpu", prefix_cache_bytes=3 * size,
                         prefix_stride=STRIDE)
    stats = engine.prefix_cache.stats
    jobs = [job_of(rng, 100) for _ in range(8)]
    for job in jobs:
        engine.score([job, job])  # seen, then saved
        assert stats.bytes <= 3 * size
    assert stats.states == 6 and stats.evictions == 10
    assert engine.prefix_cache.order()[-1] == jobs[-1].prefix
    [again] = engine.score([jobs[0]])
    assert again.cached_tokens == 0  # dropped long ago: read, then saved again
    [again] = engine.score([jobs[-1]])
    assert again.cached_tokens == 100


def test_a_faulted_call_keeps_no_state(models, fault_file, rng):
    cached, *_ = models
    job = job_of(rng, 60)
    cached.score([job])
    saved = cached.prefix_cache.stats.saved
    fault_file.write_text("stale-logits")
    cached.score([job])  # its passes never ran: nothing to keep
    assert cached.prefix_cache.stats.saved == saved
    [got] = cached.score([job])
    assert got.cached_tokens == 0 and cached.prefix_cache.stats.saved == saved + 2


def test_short_prefixes_are_never_routed(rng):
    class Cache:
        def longest(self, prefix, lengths):
            raise AssertionError("looked up")

    router = PrefixRouter(Cache(), STRIDE)
    short = job_of(rng, STRIDE - 1)
    assert router.routes([short, short, short]) == {}
