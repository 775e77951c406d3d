"""The llama.cpp engine on the real gemma-3-270m, checked against plain one-sequence
decodes with llama-cpp-python's own Llama class (no shared prefix, no token tree)."""

from __future__ import annotations

import numpy as np
import pytest

from decider.engines import Branch, ScoreJob, load_engine
from decider.errors import ConfigError, PromptTooLong
from decider.scoring import answer_log_probs, build_candidates
from helpers.plain_llama import plain_llama, plain_rows

# The plain decodes use the engine's batches (the prefix alone, each branch appended to
# the kept prefix), flash attention setting and weight layout:
# with the same batches llama.cpp gives the same logits. Other batch shapes move its
# logits by up to ~0.3 (flash attention tiles queries past 64 tokens a batch) and
# probabilities by up to 0.05 (docs/design.md, "The llama.cpp engine") - 0.054 measured
# here - hence P_TOL.
LOGIT_TOL = 1e-4
P_TOL = 0.08
WINDOW = 512  # gemma-3-270m's sliding window


@pytest.fixture(scope="module")
def engine(model_path):
    e = load_engine("llama", model_path, 4096, n_parallel=2)
    yield e
    e.close()


@pytest.fixture(scope="module")
def plain(model_path):
    llm = plain_llama(model_path)
    yield llm
    llm.close()


def words(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    pool = "the a customer order parcel refund late broken screen price paid twice " \
           "delivery support email account password login error charge card bank".split()
    return " ".join(rng.choice(pool, n))


def test_swa_full_is_off_and_the_kv_cache_is_bounded(model_path):
    e = load_engine("llama", model_path, 32768, n_parallel=1)
    try:
        (full_bytes, full_cells, full_layers), (swa_bytes, swa_cells, swa_layers) = e.kv_caches
        assert (full_cells, full_layers, swa_layers) == (32768, 3, 15)
        # window x 2 sequences (prefix, one branch) + one ubatch; swa_full would be 32768
        assert swa_cells == 2 * WINDOW + 512
        assert e.info.memory["kv"] == full_bytes + swa_bytes
        assert e.info.memory["kv"] < 120 * 2**20  # swa_full on: 576 MiB
    finally:
        e.close()


def test_n_ctx_outside_the_trained_context_is_refused(model_path):
    for bad in (31, 32769):
        with pytest.raises(ConfigError, match=r"n_ctx must be in \[32, 32768\]"):
            load_engine("llama", model_path, bad)


def test_labels_sharing_a_first_token_match_a_direct_computation(engine, plain):
    tok = engine.tokenize
    prefix = (engine.info.bos_id, *tok(f"Text: {words(40, 1)}\n\n"))
    suffix = tuple(tok("Question: What does the customer want?\nAnswer:"))
    forms = [[" refund request"], [" refund status"], [" billing"]]
    cands = build_candidates(forms, tok, tuple(tok("\n")))
    first = {c[0] for c in cands.sequences}
    assert len(first) == 2  # the two refund labels share their first token

    [[result]] = engine.score([ScoreJob(prefix, (Branch(suffix, cands.sequences),))])
    lp = answer_log_probs(cands, result, 3)

    # direct: one plain sequence per label, softmax over the allowed tokens at each step
    def allowed_softmax(logits, path):
        ids = sorted({c[len(path)] for c in cands.sequences if c[: len(path)] == path})
        x = logits[ids].astype(np.float64)
        return dict(zip(ids, np.exp(x - x.max()) / np.exp(x - x.max()).sum()))

    # one plain sequence through the shared first token gives every trie position's row
    shared = next(c for c in cands.sequences if len(c) > 1)[:1]
    rows = plain_rows(plain, prefix, suffix + shared)  # two decodes, as the engine's
    answer = len(prefix) + len(suffix) - 1
    expected = []
    for seq in cands.sequences:
        p = 1.0
        for k in range(len(seq)):
            p *= allowed_softmax(rows[answer + k], seq[:k])[seq[k]]
        expected.append(p)
    np.testing.assert_allclose(np.exp(lp), expected, atol=1e-6)
    assert abs(lp[0] - lp[1]) > 1e-3  # different scores, not one first-token score
    for node in result:  # and the raw logits themselves
        expected_row = rows[answer + len(node.path)][list(node.token_ids)]
        np.testing.assert_allclose(node.logits, expected_row, atol=LOGIT_TOL)


@pytest.fixture(scope="module")
def serial(model_path):
    """One branch per decode: every branch has an exact one-sequence equivalent."""
    e = load_engine("llama", model_path, 4096, n_parallel=1)
    yield e
    e.close()


@pytest.mark.parametrize("prefix_words", [30, 700])  # the second is past the sliding window
def test_a_shared_prefix_gives_the_logits_of_separate_plain_passes(serial, engine, plain,
                                                                   prefix_words):
    tok = serial.tokenize
    prefix = (serial.info.bos_id, *tok(f"Text: {words(prefix_words, prefix_words)}\n\n"))
    labels = tuple((t,) for t in tok(" yes no maybe"))
    questions = ["Is it late?", "Was the customer charged twice?", "Is a screen broken?"]
    branches = tuple(Branch(tuple(tok(f"Question: {q}\nAnswer:")), labels) for q in questions)
    assert len(prefix) > WINDOW + 50 or prefix_words < 100
    [shared] = serial.score([ScoreJob(prefix, branches)])
    for branch, [root] in zip(branches, shared):
        expected = plain_rows(plain, prefix, branch.suffix)[-1]  # appended to the prefix
        np.testing.assert_allclose(root.logits, expected[list(root.token_ids)], atol=LOGIT_TOL)
        lse = np.log(np.exp(expected.astype(np.float64) - expected.max()).sum()) + expected.max()
        assert root.logsumexp == pytest.approx(lse, abs=LOGIT_TOL)

    # several branches per decode: llama.cpp's batch-shape noise only
    [batched] = engine.score([ScoreJob(prefix, branches)])
    for [a], [b] in zip(shared, batched):
        np.testing.assert_allclose(softmax(a.logits), softmax(b.logits), atol=P_TOL)


def softmax(x):
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_input_longer_than_n_batch_is_split(model_path):
    engine = load_engine("llama", model_path, 4096, n_batch=32, n_parallel=1)
    llm = plain_llama(model_path, n_batch=32)
    try:
        tok = engine.tokenize
        prefix = (engine.info.bos_id, *tok(f"Text: {words(150, 7)}\n\n"))
        suffix = tuple(tok("Question: " + words(60, 8) + "?\nAnswer:"))
        assert len(prefix) > 2 * 32 and len(suffix) > 32
        [[[root]]] = engine.score([ScoreJob(prefix, (Branch(suffix, ((3,), (4,))),))])
        expected = plain_rows(llm, prefix, suffix)[-1][[3, 4]]  # the same 32-token chunks
        np.testing.assert_allclose(root.logits, expected, atol=LOGIT_TOL)
    finally:
        engine.close()
        llm.close()


def test_a_stop_between_chunks_ends_that_job_alone(model_path):
    """stop(i) is asked before each 32-token chunk of job i; the error it returns is job
    i's result, its later chunks are never decoded, and the next job of the call is
    scored as it is alone."""
    engine = load_engine("llama", model_path, 4096, n_batch=32, n_parallel=1)
    try:
        tok = engine.tokenize
        long_job = ScoreJob((engine.info.bos_id, *tok(f"Text: {words(150, 3)}\n\n")),
                            (Branch(tuple(tok("Question: Is it late?\nAnswer:")), ((3,), (4,))),))
        short_job = ScoreJob((engine.info.bos_id, *tok("Text: my parcel is late\n\n")),
                             long_job.branches)
        assert len(long_job.prefix) > 4 * 32
        asked, error = [], TimeoutError("past its deadline")

        def stop(i):
            asked.append(i)
            return error if asked == [0, 0] else None

        stopped, scored = engine.score([long_job, short_job], stop)
        assert stopped is error
        assert asked == [0, 0, 1, 1]  # one chunk of the long job; the short job's two decodes
        [[[alone]]] = engine.score([short_job])
        np.testing.assert_array_equal(scored[0][0].logits, alone.logits)
    finally:
        engine.close()


def test_the_window_is_checked_before_any_decode(model_path, fault_file):
    e = load_engine("llama", model_path, 64)
    try:
        fault_file.write_text("oom")  # a pass that starts would take this and fail with OOM
        job = ScoreJob((2,) * 60, (Branch((3,) * 4, ((5,), (6,))),))
        with pytest.raises(PromptTooLong) as info:
            e.score([job])
        assert (info.value.prompt_tokens, info.value.n_ctx) == (65, 64)
        assert fault_file.exists()
    finally:
        e.close()


def test_random_weights_with_the_real_tokenizer_load_in_llama_cpp(model_path, tmp_path):
    """`decider bench --shape` writes random weights with the model's tokenizer, so the
    llama engine runs the same work as the torch engines on them."""
    from decider.bench.random_gguf import T, write_tiny_gemma3

    path = write_tiny_gemma3(tmp_path / "r.gguf", np.random.default_rng(0), layers=2,
                             hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=128,
                             vocab=262144, tokenizer_from=model_path,
                             types={"attn_output": T.Q8_0, "ffn_down": T.Q8_0})  # K < 256
    random = load_engine("llama", path, 256)
    real = load_engine("llama", model_path, 256)
    text = "Was the parcel late? (yes or no)"
    assert random.tokenize(text) == real.tokenize(text)
    [[result]] = random.score([ScoreJob((2, *random.tokenize(text)), (
        Branch(tuple(random.tokenize("\nAnswer:")), ((3,), (4,))),))])
    assert np.isfinite(result[0].logits).all()
    random.close()
    real.close()
    with pytest.raises(ValueError, match="262144 tokens, the model 384"):
        write_tiny_gemma3(tmp_path / "s.gguf", np.random.default_rng(0), vocab=384,
                          tokenizer_from=model_path)


def test_random_weights_with_a_made_up_vocabulary_load_in_llama_cpp(tmp_path):
    """Where the model is absent, `decider bench --shape` gives the random weights a
    synthetic vocabulary: llama.cpp loads it, and both engines read text the same way."""
    from decider.bench.random_gguf import write_tiny_gemma3

    path = write_tiny_gemma3(tmp_path / "v.gguf", np.random.default_rng(0), vocab=600,
                             synthetic_vocab=True)
    llama, torch_engine = load_engine("llama", path, 256), load_engine("triton", path, 256)
    try:
        assert llama.info.n_vocab == 600
        ids = llama.tokenize("a late parcel")
        # a leading word boundary, a boundary (id 260) per space, bytes (id 4 + byte)
        want = [260 if c == " " else 4 + ord(c) for c in " a late parcel"]
        assert ids == torch_engine.tokenize("a late parcel") == want
        job = ScoreJob((2, *ids), (Branch((300, 301), ((4,), (5,))),))
        [[[node]]] = llama.score([job])
        assert np.isfinite(node.logits).all()
    finally:
        llama.close()
        torch_engine.close()
    with pytest.raises(ValueError, match="at least 260 tokens, got 100"):
        write_tiny_gemma3(tmp_path / "w.gguf", np.random.default_rng(0), vocab=100,
                          synthetic_vocab=True)


def test_engine_bench_runs_each_engine_in_its_own_process(tmp_path, capsys):
    """`decider bench --engines`: the same jobs through each engine, each in a fresh
    process; an engine that fails is reported and the others still make the table."""
    from decider.bench.engines import run_engine_bench
    from decider.bench.random_gguf import write_tiny_gemma3

    path = write_tiny_gemma3(tmp_path / "b.gguf", np.random.default_rng(0), vocab=600,
                             synthetic_vocab=True)
    table = run_engine_bench(str(path), ["llama", "reference:int4", "triton"], repeat=2,
                             prompt_tokens=(20, 40), batch=3, batch_tokens=16, n_ctx=128)
    out = capsys.readouterr().out
    assert list(table) == ["llama", "triton"]
    assert "reference:int4: failed: ConfigError: dtype must be" in out
    for col in table.values():
        assert list(col) == ["1 yes/no, 20 tokens (ms)", "1 yes/no, 40 tokens (ms)",
                             "3 x 16 tokens (decisions/s)"]
        assert all(v > 0 for v in col.values())
    assert "llama/triton" in out and "reference" not in out.split("failed")[1]


def test_llama_cpps_own_reason_is_kept_when_it_refuses_a_file(model_path, tmp_path):
    from decider.engines.vocab import Vocab
    from decider.errors import EngineFailure

    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))
    for load in (lambda: load_engine("llama", cut, 512), lambda: Vocab(cut, True)):
        with pytest.raises(EngineFailure, match="could not load .*cut.gguf: .*failed to read"):
            load()
