"""An answer does not depend on the other questions of its request, nor on the order the
questions or the options come in (docs/design.md, "Order"): generated requests of 2-6
mixed questions, each asked five ways (as generated; questions reordered; options
reordered; both; each question alone), on every engine a CPU runs, every probability and
label mass within 1e-6 of the request as generated. Each way's requests go to the engine
in one call, as the daemon batches requests.

The tiny model has the real tokenizer (so labels are one token or several, as in use), a
32-token sliding window and quantized weights (llama.cpp then quantizes activations). The
llama.cpp engine runs twice: as loaded by default, and with 64-token batches and two label
paths a decode, whose cells hold a prefix of ~200 tokens (longer ones take the alone
layout, and a question's decodes are cut into chunks)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from decider.bench.random_gguf import T, write_tiny_gemma3
from decider.engines import load_engine
from decider.plan import build_plan
from decider.prompts import FORMATS
from decider.questions import (
    Choice,
    Label,
    MultiLabel,
    MultiLabelAnswer,
    Request,
    Scale,
    YesNo,
    YesNoAnswer,
)
from helpers.seeds import seeded

P_TOL = 1e-6
N_REQUESTS, N_REAL = 200, 10
N_CTX = 1024
WORDS = ("billing shipping refund late broken account login password card bank screen price "
         "order parcel delivery support email error charge twice week store reply box damaged "
         "wrong size colour return urgent customer").split()
LEVELS = ("none", "low", "medium", "high", "critical", "extreme")


def label_names(rng, n: int) -> list[str]:
    """n names, distinct without case: words (one token) or a few letters (several)."""
    names: dict[str, str] = {}
    while len(names) < n:
        if rng.random() < 0.7:
            name = str(rng.choice(WORDS))
        else:
            name = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 5)))
        if rng.random() < 0.2:
            name = name.capitalize()
        names.setdefault(name.casefold(), name)
    return list(names.values())


def labels(rng, n: int) -> list[Label]:
    return [Label(name, f"about {rng.choice(WORDS)}" if rng.random() < 0.2 else "")
            for name in label_names(rng, n)]


def question(rng):
    kind = rng.integers(4)
    if kind == 0:
        return YesNo(f"Is it about {rng.choice(WORDS)}?")
    if kind == 1:
        return Choice(f"Which {rng.choice(WORDS)} topic?", labels(rng, int(rng.integers(2, 6))))
    if kind == 2:
        return MultiLabel("Which apply?", labels(rng, int(rng.integers(1, 5))))
    start = int(rng.integers(0, 3))
    return Scale("How urgent?", LEVELS[start:start + int(rng.integers(2, 5))])


def requests(rng, n: int, longest: int) -> list[Request]:
    return [Request(" ".join(rng.choice(WORDS, int(rng.integers(3, longest)))),
                    tuple(question(rng) for _ in range(int(rng.integers(2, 7))))).validate()
            for _ in range(n)]


def reordered(rng, q):
    """The question with its options in another order (a scale's order is its meaning)."""
    if isinstance(q, (Choice, MultiLabel)) and len(q.labels) > 1:
        k = int(rng.integers(1, len(q.labels)))
        return dataclasses.replace(q, labels=q.labels[k:] + q.labels[:k])
    return q


def ways(rng, request: Request) -> list[list[tuple[Request, list[int]]]]:
    """The request asked five ways: each way's requests, with the index in the request as
    generated of each of their questions."""
    qs, text = request.questions, request.text
    k = int(rng.integers(1, len(qs)))
    order = [*range(k, len(qs)), *range(k)]
    options = [reordered(rng, q) for q in qs]
    return [
        [(request, list(range(len(qs))))],
        [(Request(text, tuple(qs[i] for i in order)), order)],
        [(Request(text, tuple(options)), list(range(len(qs))))],
        [(Request(text, tuple(options[i] for i in order[::-1])), order[::-1])],
        [(Request(text, (q,)), [i]) for i, q in enumerate(qs)],
    ]


def numbers(answer) -> dict[tuple[str, str], float]:
    """Every probability of an answer, and its label mass, by label name."""
    if isinstance(answer, YesNoAnswer):
        out = {("p", "yes"): answer.p_yes}
    elif isinstance(answer, MultiLabelAnswer):
        out = {("p", d.label): d.p for d in answer.labels}
        out |= {("mass", d.label): d.label_mass for d in answer.labels}
    else:
        out = {("p", k): v for k, v in answer.probabilities.items()}
    return out | {("mass", ""): answer.label_mass}


def answered(engine, way: list[tuple[Request, list[int]]]) -> dict[int, dict]:
    """One way's requests in one engine call: each question's numbers, by its index."""
    plans = [build_plan(r, FORMATS["plain"], engine.tokenize, engine.info.bos_id)
             for r, _ in way]
    results = engine.score([p.job for p in plans])
    return {i: numbers(a) for p, res, (_, at) in zip(plans, results, way, strict=True)
            for i, a in zip(at, p.read(res), strict=True)}


def worst_difference(engine, rng, reqs: list[Request]) -> float:
    worst = 0.0
    for request in reqs:
        first, *others = (answered(engine, way) for way in ways(rng, request))
        for other in others:
            for i, want in first.items():
                assert other[i].keys() == want.keys()
                worst = max(worst, *(abs(other[i][k] - v) for k, v in want.items()))
    return worst


@pytest.fixture(scope="module")
def tiny(model_path, tmp_path_factory):
    return write_tiny_gemma3(tmp_path_factory.mktemp("order") / "tiny.gguf",
                             seeded("test_order model"), layers=6, hidden=64, heads=2,
                             kv_heads=1, head_dim=32, ffn=128, vocab=262144, window=32,
                             tokenizer_from=model_path,
                             types={"attn_output": T.Q8_0, "ffn_down": T.Q8_0})  # K < 256


ENGINES = {
    "llama": ("llama", {}),
    "llama-small-batches": ("llama", {"n_batch": 64, "n_parallel": 2}),
    "triton": ("triton", {"device": "cpu"}),
    "reference": ("reference", {}),
}


@pytest.mark.parametrize("name", list(ENGINES))
def test_answers_do_not_depend_on_other_questions_or_order(tiny, rng, name):
    kind, options = ENGINES[name]
    engine = load_engine(kind, tiny, N_CTX, **options)
    try:
        start = time.perf_counter()
        worst = worst_difference(engine, rng, requests(rng, N_REQUESTS, 250))
        print(f"{name}: largest difference {worst:.3g} over {N_REQUESTS} requests, "
              f"{time.perf_counter() - start:.1f} s")
    finally:
        engine.close()
    assert worst <= P_TOL


def test_the_real_model_on_llama_cpp_too(decider, rng):
    worst = worst_difference(decider.engine, rng, requests(rng, N_REAL, 60))
    print(f"gemma-3-270m: largest difference {worst:.3g} over {N_REAL} requests")
    assert worst <= P_TOL
