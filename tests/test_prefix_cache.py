"""The prefix cache: a job whose prefix, or a multiple of n_batch tokens of it, was read
before computes only the rest, and its logits are bit-equal to a fresh read's: for
prefixes ending before, at and past each multiple of the sliding window and of n_batch,
for a prefix that extends a saved one, with the sliding cache wrapped around; the cache
holds its budget and drops the least recently used; a faulted pass is never kept.

On a tiny random Gemma 3 (window 64, batches of 64, quantized as the real model is, flash
attention on as in the daemon) every length runs in seconds; the last test does a few
lengths on the real model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider.bench.random_gguf import write_tiny_gemma3
from decider.engines import ScoreJob, load_engine
from decider.engines.llama_layout import Decode, Save, prefix_steps
from decider.engines.prefix_cache import PrefixCache, saved_lengths
from helpers.llama_jobs import random_job

WINDOW, N_BATCH, N_CTX, VOCAB = 64, 64, 512, 600
LENGTHS = sorted({n for k in range(1, N_CTX // WINDOW) for n in (64 * k - 1, 64 * k, 64 * k + 1)}
                 | {2, 30})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix-cache") / "tiny.gguf"
    return write_tiny_gemma3(path, np.random.default_rng(23), layers=4, hidden=256, heads=4,
                             kv_heads=1, head_dim=64, ffn=512, vocab=VOCAB, window=WINDOW,
                             synthetic_vocab=True)


# n_parallel 1: a sliding cache of 2 windows + a batch (192 cells), which the prefixes
# past it wrap around; 4: 320 cells
@pytest.fixture(scope="module", params=[1, 4], ids=["n_parallel=1", "n_parallel=4"])
def engines(tiny, request):
    fresh = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, n_parallel=request.param)
    cached = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, n_parallel=request.param,
                         prefix_cache_bytes=2**28)
    yield fresh, cached
    fresh.close()
    cached.close()


def assert_bit_equal(got, want) -> None:
    assert len(got) == len(want)
    for branch_got, branch_want in zip(got, want, strict=True):
        for a, b in zip(branch_got, branch_want, strict=True):
            assert a.path == b.path and a.token_ids == b.token_ids
            assert np.array_equal(a.logits, b.logits), (a.path, a.logits - b.logits)
            assert a.logsumexp == b.logsumexp


@pytest.mark.parametrize("length", LENGTHS)
def test_a_prefix_read_again_is_bit_equal_to_a_fresh_read(engines, rng, length):
    fresh, cached = engines
    job = random_job(rng, length, 3, suffix=(3, 12))
    [want] = fresh.score([job])
    [first] = cached.score([job])
    [again] = cached.score([job])
    assert first.cached_tokens == 0 and again.cached_tokens == length
    assert_bit_equal(first, want)
    assert_bit_equal(again, want)


@pytest.mark.parametrize(("saved", "extended"), [(30, 200), (64, 200), (65, 129), (130, 480),
                                                 (300, 301)])
def test_a_prefix_extending_a_saved_one_starts_from_its_last_batch(engines, rng, saved,
                                                                   extended):
    fresh, cached = engines
    first = random_job(rng, saved, 1)
    more = tuple(int(t) for t in rng.integers(4, VOCAB, extended - saved))
    job = ScoreJob(first.prefix + more, random_job(rng, 2, 2).branches)
    cached.score([first])
    [got] = cached.score([job])
    # the longest saved length of `first` that is a multiple of n_batch; none for a prefix
    # past the cells of the sliding cache (`room`), which is only ever read whole
    shared = max((n for n in saved_lengths(first.prefix, N_BATCH) if n % N_BATCH == 0),
                 default=0)
    assert got.cached_tokens == (shared if extended <= cached.room else 0)
    assert_bit_equal(got, fresh.score([job])[0])


@pytest.mark.parametrize(("at", "shared"), [(280, 256), (200, 0), (1, 0)])
def test_a_prefix_that_differs_reads_only_a_saved_state_it_shares(engines, rng, at, shared):
    """A job of 300 tokens keeps its state at 256 and at 300: a prefix differing from it
    at `at` finds the one before the change, if any, where 300 tokens fit the sliding
    cache's cells."""
    _, cached = engines
    job = random_job(rng, 300, 1)
    cached.score([job])
    changed = list(job.prefix)
    changed[at] = 5 if changed[at] == 4 else 4
    [got] = cached.score([ScoreJob(tuple(changed), job.branches)])
    assert got.cached_tokens == (shared if len(changed) <= cached.room else 0)


def test_a_faulted_pass_is_never_kept(tiny, rng, tmp_path, monkeypatch):
    engine = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, prefix_cache_bytes=2**28)
    try:
        monkeypatch.setenv("DECIDER_FAULT_FILE", str(tmp_path / "fault"))
        (tmp_path / "fault").write_text("skip-decode")
        job = random_job(rng, 150, 1)
        engine.score([job])
        assert engine.prefix_cache.stats.states == 0
        [again] = engine.score([job])
        assert again.cached_tokens == 0 and engine.prefix_cache.stats.states == 2
    finally:
        engine.close()


@given(start_batches=st.integers(0, 8), length=st.integers(1, 600),
       stride=st.sampled_from([0, 64, 512]))
def test_the_prefix_decodes_break_where_a_whole_read_does(start_batches, length, stride):
    """From a restored start (0, a multiple of the stride, or the whole prefix) the prefix's
    decodes cover the rest once, break at multiples of the stride, and save at the last
    one and at the end."""
    prefix = tuple(range(length))
    start = min(start_batches * (stride or 1), length) if stride else 0
    steps = list(prefix_steps(prefix, start, stride))
    decoded = [e.pos for s in steps if isinstance(s, Decode) for e in s.entries]
    assert decoded == list(range(start, length))
    assert all(s.entries[0].pos % stride == 0 for s in steps
               if isinstance(s, Decode) and stride)
    saves = [s.n for s in steps if isinstance(s, Save)]
    if not stride:
        assert saves == []
    elif start < length:
        last = (length - 1) // stride * stride
        assert saves == ([last] if last > start else []) + [length]
        assert set(saves) <= set(saved_lengths(prefix, stride))


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 400), st.booleans()),
                max_size=60))
def test_the_cache_keeps_its_budget_and_drops_the_least_recently_used(ops):
    """Puts of states of random sizes and lookups, against a plain list as the model."""
    cache, model = PrefixCache(1000), []  # model: (tokens, size), least recently used first
    for key, size, lookup in ops:
        tokens = (key,)
        if lookup:
            n, state = cache.longest(tokens, [1])
            hit = next((m for m in model if m[0] == tokens), None)
            assert (state is not None) == (hit is not None) and n == (1 if hit else 0)
            if hit:
                model.remove(hit)
                model.append(hit)
                assert len(state) == hit[1]
        else:
            cache.put(tokens, bytearray(size), size)
            if all(m[0] != tokens for m in model) and size <= 1000:
                model.append((tokens, size))
                while sum(s for _, s in model) > 1000:
                    model.pop(0)
        assert cache.stats.bytes == sum(s for _, s in model) <= 1000
        assert cache.order() == [t for t, _ in model]


def test_ten_thousand_distinct_states_keep_memory_within_the_budget(tiny, rng):
    """A hostile stream: every job a state never seen, 10,000 of them. The cache holds at
    most its budget after every call, counts every state it dropped, and the process's
    memory stops growing once the cache is full."""
    budget = 2**20
    engine = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, prefix_cache_bytes=budget)
    try:
        stats = engine.prefix_cache.stats
        for call in range(100):
            engine.score([random_job(rng, int(rng.integers(10, 30)), 1, suffix=(1, 3))
                          for _ in range(100)])
            assert stats.bytes <= budget
            if call == 9:
                rss_full = _rss()
        assert stats.misses == 10_000 and stats.hits == 0
        assert stats.evictions == stats.saved - stats.states > 0
        assert _rss() - rss_full < 32 * 2**20
    finally:
        engine.close()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_state_larger_than_the_budget_is_not_kept():
    cache = PrefixCache(100)
    cache.put((1,), bytearray(60), 60)
    cache.put((2,), bytearray(101), 101)
    assert cache.order() == [(1,)] and cache.stats.evictions == 0


def test_the_real_model_reads_a_saved_prefix_bit_equal(model_path, rng):
    """gemma-3-270m (window 512, batches of 512): prefixes before, at and past the window,
    asked again, and one extending a saved one."""
    fresh = load_engine("llama", model_path, 2048)
    cached = load_engine("llama", model_path, 2048, prefix_cache_bytes=2**30)
    try:
        def job(prefix):
            return ScoreJob(prefix, random_job(rng, 2, 2).branches)

        ids = tuple(int(t) for t in rng.integers(1000, 200_000, 1400))
        for n in (511, 512, 513):
            j = job((2, *ids[: n - 1]))
            cached.score([j])
            [again] = cached.score([j])
            assert again.cached_tokens == n
            assert_bit_equal(again, fresh.score([j])[0])
        j = job((2, *ids))
        [got] = cached.score([j])
        assert got.cached_tokens == 512
        assert_bit_equal(got, fresh.score([j])[0])
    finally:
        fresh.close()
        cached.close()
