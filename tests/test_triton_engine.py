"""The Triton engine on tiny random Gemma 3 GGUF models, against the transformers
reference engine on the same file. Token ids are built directly (the tiny files hold no
tokenizer). Fresh random weights and prompts every run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from decider.bench.random_gguf import T, write_tiny_gemma3
from decider.engines import Branch, ScoreJob, load_engine
from decider.errors import (
    ActivationOverflow,
    ConfigError,
    EngineFailure,
    EngineOutOfMemory,
    PromptTooLong,
)
from helpers.seeds import seeded
from helpers.tiny import TOL, VOCAB, WINDOW, max_diff, rand_branch, rand_ids
from helpers.unwritten import assert_unwritten_rows_refused

MIXES = {
    # every packed type and a dense one, with the embedding (and tied head) Q8_0
    "mixed": {},
    # a 4-bit embedding and head; dense F32 projections
    "q4k-head": {"token_embd": T.Q4_K, "attn_q": T.F32, "ffn_up": T.Q8_0},
}


@pytest.fixture(scope="module", params=list(MIXES))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf"
    write_tiny_gemma3(path, seeded(f"tiny[{request.param}]"), window=WINDOW, vocab=VOCAB,
                      types=MIXES[request.param])
    triton_engine = load_engine("triton", path, 256, device="cpu")
    reference = load_engine("reference", path, 256)
    yield path, triton_engine, reference
    triton_engine.close()
    reference.close()


def test_label_logits_match_the_reference(tiny, rng):
    _, engine, reference = tiny
    jobs = [ScoreJob((2, *rand_ids(rng, n)), tuple(rand_branch(rng, s) for s in (1, 4, 9)))
            for n in (3, 30, 70)]
    got, want = engine.score(jobs), reference.score(jobs)
    assert max(max_diff(g, w) for g, w in zip(got, want)) < TOL


@pytest.mark.parametrize("n_batch", [7, 20, 512])  # prefix chunks below, above, past the window
@pytest.mark.parametrize("length", [WINDOW - 1, WINDOW, WINDOW + 1, 3 * WINDOW])
def test_sliding_window_edges(tiny, length, n_batch, rng):
    path, _, reference = tiny
    engine = load_engine("triton", path, 256, device="cpu", n_batch=n_batch)
    # the answer position is token `length - 1`; its two-token label paths cross the edge
    job = ScoreJob((2, *rand_ids(rng, length - 4)), (rand_branch(rng, 3), rand_branch(rng, 1)))
    [got], [want] = engine.score([job]), reference.score([job])
    assert max_diff(got, want) < TOL


@pytest.mark.parametrize("questions", [1, 4])
def test_prefixes_of_many_windows_go_through_the_ring_of_window_slots(tiny, rng, questions):
    """Every length 16k - 1, 16k, 16k + 1 up to n_ctx, and exactly n_ctx: in prefix chunks
    of 40 tokens through the KV cache (its sliding layers a ring of 16 slots, wrapped
    within a chunk) they give what the same jobs give in whole passes (no cache), and
    the reference at n_ctx."""
    path, whole, reference = tiny
    n_ctx = 160  # ten windows
    ring = load_engine("triton", path, n_ctx, device="cpu", n_batch=40)
    jobs = []
    for n in sorted({n for k in range(1, n_ctx // WINDOW + 1)
                     for n in (WINDOW * k - 1, WINDOW * k, WINDOW * k + 1)}):
        branches = tuple(rand_branch(rng, int(rng.integers(1, 6))) for _ in range(questions))
        n = min(n, n_ctx - max(b.positions() + 1 for b in branches))  # the last: all of n_ctx
        jobs.append(ScoreJob((2, *rand_ids(rng, n - 1)), branches))
    assert jobs[-1].window_tokens() == n_ctx
    for job, got, want in zip(jobs, ring.score(jobs), whole.score(jobs), strict=True):
        assert max_diff(got, want) < TOL, f"prefix {len(job.prefix)}"
    assert max_diff(ring.score(jobs[-1:])[0], reference.score(jobs[-1:])[0]) < TOL
    ring.close()


def test_a_shared_prefix_with_several_branches_equals_separate_passes(tiny, rng):
    _, engine, reference = tiny
    prefix = (2, *rand_ids(rng, 2 * WINDOW + 5))
    branches = tuple(rand_branch(rng, s) for s in (2, 5, 1, 12))
    [shared] = engine.score([ScoreJob(prefix, branches)])
    alone = [engine.score([ScoreJob(prefix, (b,))])[0][0] for b in branches]
    assert max_diff(shared, alone) < 1e-4  # same math in other matmul shapes: fp32 rounding
    assert max_diff(shared, reference.score([ScoreJob(prefix, branches)])[0]) < TOL


def test_a_calls_results_outlive_the_next_call(tiny, rng):
    """Results are views of the array a call reads back, never of the engine's buffer."""
    _, engine, _ = tiny
    jobs = [ScoreJob((2, *rand_ids(rng, 12)), (rand_branch(rng, 3),)) for _ in range(2)]
    [first] = engine.score(jobs[:1])
    kept = [node.logits.copy() for node in first[0]]
    engine.score(jobs[1:])
    assert all(np.array_equal(node.logits, k) for node, k in zip(first[0], kept, strict=True))


def test_unwritten_rows_are_refused_by_the_guard(tiny, fault_file, rng):
    _, engine, _ = tiny
    job = ScoreJob((2, *rand_ids(rng, 20)), (rand_branch(rng, 3),))
    other = ScoreJob((2, *rand_ids(rng, 20)),
                     (Branch(rand_ids(rng, 3), job.branches[0].candidates),))
    guard = assert_unwritten_rows_refused(engine, job, other, fault_file)
    fault_file.write_text("oom")
    with pytest.raises(EngineOutOfMemory):
        engine.score([job])
    guard.check([other], engine.score([other]))  # and the next pass is whole again


def test_the_window_is_checked_before_any_compute(tiny, fault_file):
    path, _, _ = tiny
    engine = load_engine("triton", path, 32, device="cpu")
    fault_file.write_text("oom")  # a pass that starts would take this and fail
    job = ScoreJob((2,) * 28, (Branch((3,) * 4, ((5,), (6, 7))),))
    with pytest.raises(PromptTooLong) as info:
        engine.score([job])
    assert (info.value.prompt_tokens, info.value.n_ctx) == (34, 32)
    assert fault_file.exists()


def test_load_settings_and_a_missing_tokenizer_are_refused(tiny):
    path, engine, _ = tiny
    for name in ("triton", "reference"):
        with pytest.raises(ConfigError, match=r"n_ctx must be in \[32, 4096\]"):
            load_engine(name, path, 4097)
    with pytest.raises(EngineFailure, match="holds no tokenizer"):
        engine.tokenize("hello")
    assert engine.info.sentinel is not None and engine.info.n_vocab == VOCAB


def test_an_option_the_engine_lacks_is_refused_by_name(tiny):
    path, _, _ = tiny
    with pytest.raises(ConfigError, match="the triton engine has no option 'n_gpu_layers'; "
                       "it takes model_name, device, dtype"):
        load_engine("triton", path, 256, device="cpu", n_gpu_layers=-1)
    with pytest.raises(ConfigError, match="dtype must be bfloat16, float16 or float32"):
        load_engine("triton", path, 256, device="cpu", dtype="fp8")


def test_an_fp16_overflow_is_refused_with_its_limit_and_the_way_out(tiny, rng):
    """An activation past 65504 becomes inf, then NaN through the next norm: the call is
    refused with an error naming the dtype and its limit. bf16, which has fp32's range,
    answers the same model finitely."""
    path, _, _ = tiny
    job = ScoreJob((2, *rand_ids(rng, 20)), (rand_branch(
        rng, 3),))
    answers = {}
    for dtype in ("float16", "bfloat16"):
        engine = load_engine("triton", path, 256, device="cpu", dtype=dtype)
        engine.model.blocks[1].ffn_norm.mul_(1e4)  # gate and up outputs past fp16's range
        try:
            answers[dtype] = engine.score([job])
        except ActivationOverflow as e:
            answers[dtype] = e
        engine.close()
    err = answers["float16"]
    assert isinstance(err, ActivationOverflow), err
    assert "float16's limit of 65504" in err.message and 'dtype "bfloat16"' in err.message
    assert err.kind == "out_of_range"
    assert all(np.isfinite(n.logits).all() for n in answers["bfloat16"][0][0])


def test_a_tensor_type_it_cannot_hold_exactly_is_refused_at_load(tmp_path, rng):
    path = write_tiny_gemma3(tmp_path / "q5k.gguf", rng, layers=1,
                             types={"ffn_up": T.Q5_K})
    with pytest.raises(ConfigError, match=r"'blk\.0\.ffn_up\.weight' has GGML type Q5_K"):
        load_engine("triton", path, 256, device="cpu")


def test_nothing_outside_the_engines_imports_torch_at_import_time():
    code = ("import sys, decider, decider.api, decider.commands.parser, decider.engines, "
            "decider.service.daemon; "
            "print(sorted({'torch', 'transformers', 'gguf', 'triton', 'llama_cpp'} & "
            "set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
