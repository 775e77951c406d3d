"""Every prompt that fits the loaded window is answered by the llama.cpp engine, at every
length around the sliding window's multiples, in both layouts of llama_layout.py, and
its logits are those of plain one-sequence decodes of the same tokens.

On a tiny random Gemma 3 (window 64, batches of 64) every length 64k - 1, 64k, 64k + 1 up
to n_ctx runs in seconds; test_llama_windows_real.py does the same on the real model
for the first two multiples, two drawn ones and the longest prompt."""

from __future__ import annotations

import numpy as np
import pytest

from decider.bench.random_gguf import Q4_K_M, T, write_tiny_gemma3
from decider.engines import Branch, ScoreJob, label_trie, load_engine
from decider.engines.base import trie_leaves
from decider.engines.llama_layout import Decode, job_steps, shared_groups
from helpers.llama_jobs import random_job
from helpers.plain_llama import PlainContext

WINDOW, N_BATCH, N_CTX, VOCAB = 64, 64, 1024, 600
# The plain decodes run in a context made as the engine's (the same cache sizes), with
# flash attention off on both sides (on, it sums in fp16 and moves these logits by up
# to 0.05), on F32 weights (quantized ones make llama.cpp quantize activations to 8 bits,
# where a rounding flip as batches differ moved a logit by up to 0.033). What is left is
# fp32 rounding and the f16 KV cache as batches and cell placement differ: at most
# 0.00081 in the shared layout, 0.00006 in the alone one (40 seeds at every length). The
# last ten prefix tokens changed move the label logits by 0.028 or more (150 seeds, one
# question; one token changed moved them by as little as 0.0034).
TOL = 0.005


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("windows") / "tiny.gguf"
    return write_tiny_gemma3(path, np.random.default_rng(19), layers=6, hidden=64, heads=2,
                             kv_heads=1, head_dim=32, ffn=128, vocab=VOCAB, window=WINDOW,
                             synthetic_vocab=True, types=dict.fromkeys(Q4_K_M, T.F32))


@pytest.fixture(scope="module")
def engine(tiny):
    e = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, n_parallel=4, flash_attn=False)
    yield e
    e.close()


@pytest.fixture(scope="module")
def plain(tiny):
    llm = PlainContext(tiny, N_CTX, N_BATCH, n_seq_max=5, flash_attn=False)
    yield llm
    llm.close()


def many_labels(rng, n: int) -> tuple[tuple[int, ...], ...]:
    """n labels of 2-4 tokens ending in token 7 (so none is a prefix of another), their
    first tokens drawn from 4 and the next from 5 (124 labels at most): long shared
    paths, as "topic 1", "topic 12", ... make."""
    heads, middles = np.split(rng.choice(np.arange(8, VOCAB), 9, replace=False), [4])
    labels: set[tuple[int, ...]] = set()
    while len(labels) < n:
        body = (rng.choice(heads), *rng.choice(middles, rng.integers(0, 3)))
        labels.add(tuple(int(t) for t in body) + (7,))
    return tuple(sorted(labels, key=lambda _: rng.random()))


def choice_job(rng, prefix_len: int, labels: int, yes_no: int = 3) -> ScoreJob:
    """A many-label choice with a suffix longer than the window (it lists the labels), a
    branch of multi-token labels and yes/no branches after it: groups that carry the
    choice over, and groups that mix branches."""
    def ids(n):
        return tuple(int(t) for t in rng.integers(8, VOCAB, n))

    a, b = ids(2)
    branches = (Branch(ids(int(rng.integers(WINDOW + 1, 2 * WINDOW))), many_labels(rng, labels)),
                Branch(ids(9), ((a, b, 7), (a, 7), (b, 7))),
                *(Branch(ids(int(rng.integers(3, 12))), ((5,), (6,))) for _ in range(yes_no)))
    return ScoreJob((2, *ids(prefix_len - 1)), branches)


def expected_nodes(llm, job: ScoreJob):
    """Per branch, per trie node: the row of a plain one-sequence decode of the prefix,
    then of the suffix and label path (as one decode after the prefix, rolled back after:
    PlainContext.probe). Where that is longer than a decode, the suffix but its last
    token is decoded once after the prefix, and the rest probed after it."""
    out = []
    llm.start(job.prefix)
    for branch in job.branches:
        trie = label_trie(branch.candidates)
        leaves = trie_leaves(trie)
        head, tail = (), branch.suffix
        if len(branch.suffix) + max(map(len, leaves)) > N_BATCH:
            head, tail = branch.suffix[:-1], branch.suffix[-1:]
            llm.extend(head, len(job.prefix))
        rows = {}
        for leaf in leaves:
            r = llm.probe(len(job.prefix) + len(head), tail + leaf, WINDOW)
            rows.update({leaf[:k]: r[len(tail) - 1 + k] for k in range(len(leaf) + 1)})
        out.append(rows)
        if head:
            llm.start(job.prefix)  # the prefix alone again
    return out


def prefix_lengths(window: int, n_ctx: int) -> list[int]:
    return sorted({n for k in range(1, n_ctx // window + 1)
                   for n in (window * k - 1, window * k, window * k + 1)})


def check(engine, llm, job: ScoreJob, plain_job: ScoreJob | None = None) -> None:
    """The engine's logits for `job` against plain decodes of `plain_job` (the same)."""
    [result] = engine.score([job])
    for nodes, want in zip(result, expected_nodes(llm, plain_job or job), strict=True):
        assert sorted(n.path for n in nodes) == sorted(want)
        for node in nodes:
            np.testing.assert_allclose(node.logits, want[node.path][list(node.token_ids)],
                                       atol=TOL, err_msg=f"prefix {len(job.prefix)}")


@pytest.mark.parametrize("questions", [1, 4])
def test_every_prefix_length_around_the_window_is_answered_as_plain_decodes(
        engine, plain, rng, questions):
    lengths = [n for n in prefix_lengths(WINDOW, N_CTX) if n + 12 + 3 <= N_CTX]
    jobs = [random_job(rng, n, questions) for n in lengths]
    jobs.append(random_job(rng, 0, questions, window_tokens=N_CTX))
    assert jobs[-1].window_tokens() == N_CTX
    assert min(map(len, (j.prefix for j in jobs))) < engine.room < len(jobs[-1].prefix)
    for job in jobs:  # the shared layout up to engine.room, the alone one past it
        check(engine, plain, job)
    # and the check can fail: the last ten tokens changed inside the last window
    job = jobs[-1]
    changed = ScoreJob((*job.prefix[:-10], *(4 + (t + 1) % 500 for t in job.prefix[-10:])),
                       job.branches)
    with pytest.raises(AssertionError, match="prefix"):
        check(engine, plain, job, changed)


@pytest.mark.parametrize("labels", [64, 100])
def test_many_label_choices_are_answered_as_plain_decodes_on_both_sides_of_the_room(
        engine, plain, rng, labels):
    """Prefixes around the window, the longest the shared layout takes for the choice
    (its suffix decoded once, held by sequence 0 while its leaves go on in later groups)
    and one token past it (the choice alone, the other questions still shared), against
    plain one-sequence decodes of every label path."""
    job = choice_job(rng, N_CTX // 2, labels)
    tries = [label_trie(b.candidates) for b in job.branches]
    edge = engine.room - max(len(b.suffix) + len(leaf) for b, trie in zip(job.branches, tries)
                             for leaf in trie_leaves(trie))
    for n in (WINDOW - 1, WINDOW, WINDOW + 1, edge, edge + 1):
        cut = ScoreJob(job.prefix[:n], job.branches)
        groups = [shared_groups(cut, tries, unit, 4, engine.room) for unit in cut.units()]
        assert (groups[0] is None) == (n > edge) and None not in groups[1:]
        if groups[0] is not None:
            decoded = sum(len(s.entries) for s in job_steps(cut, tries, 4, engine.room, WINDOW)
                          if isinstance(s, Decode))
            label_tokens = sum(len({(b, leaf[:k]) for b, leaf in g
                                    for k in range(1, len(leaf) + 1)})
                               for unit in groups for g in unit)
            assert decoded == n + sum(len(b.suffix) for b in job.branches) + label_tokens
            assert len(groups[0]) > 4  # the choice's suffix carried over
        check(engine, plain, cut)


def test_the_shared_layout_holds_until_the_sliding_cells_run_out(engine):
    # window x 5 sequences + one ubatch, padded to 256
    assert engine.room == 512
    (_, full_cells, _), (_, swa_cells, _) = engine.kv_caches
    assert (full_cells, swa_cells) == (N_CTX, 512)


def test_one_sequence_engines_answer_long_prompts_too(tiny, rng):
    """n_parallel=1: a prefix and one guard sequence, the fewest cells llama.cpp gives."""
    e = load_engine("llama", tiny, N_CTX, n_batch=N_BATCH, n_parallel=1, flash_attn=False)
    plain = PlainContext(tiny, N_CTX, N_BATCH, n_seq_max=2, flash_attn=False)
    try:
        (_, _, _), (_, swa_cells, _) = e.kv_caches
        assert swa_cells == 256  # 2 x 64 + 64, padded to 256
        for n in (200, 255, 256, 600, 1000):
            check(e, plain, random_job(rng, n, 4))
        # questions longer than the window: a decode reuses cells of the question itself
        check(e, plain, random_job(rng, 500, 3, suffix=(150, 300)))
    finally:
        e.close()
        plain.close()


def test_sharing_the_prefix_past_the_room_is_what_runs_out_of_cells(engine, rng,
                                                                     monkeypatch):
    """The failure the alone layout exists for: branches sharing a prefix longer than the
    sliding cells hold (the engine as it was, before the layouts)."""
    from decider.errors import EngineOutOfMemory

    monkeypatch.setattr(engine, "room", 10**9)
    with pytest.raises(EngineOutOfMemory, match="no room in the KV cache"):
        engine.score([random_job(rng, 1000, 4)])
