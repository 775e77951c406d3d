"""`decider bench`: time decisions, and the same work done with raw llama-cpp-python
calls in the same process, so what decider adds is measured, not guessed.

Workloads (medians of --repeat timed runs after one warm-up):
- raw: tokenize the rendered prompt, one llama_decode, read the answer row, p_yes
- decider 1 yes/no: Decider.decide with one question on the same text
- decider 4 questions in one request, against 4 requests of one question each
With --server ADDRESS it measures a running daemon instead (decider/bench_service.py).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..api import Decider
from ..catalog import Catalog
from ..prompts import prompt_text
from ..questions import YesNo

WORDS = ("order parcel refund late broken screen price paid twice delivery support email "
         "account password login error charge card bank customer invoice").split()
QUESTIONS = ["Does the customer ask for a refund?", "Is the customer angry?",
             "Is this about a delivery?", "Is a payment mentioned?"]


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


class RawLlama:
    """The decision with nothing but llama-cpp-python calls, set up as the engine is."""

    def __init__(self, path: str, n_ctx: int, n_threads: int) -> None:
        import llama_cpp as ll

        self.ll = ll
        mp = ll.llama_model_default_params()
        mp.use_extra_bufts = False
        self.model = ll.llama_model_load_from_file(path.encode(), mp)
        self.vocab = ll.llama_model_get_vocab(self.model)
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.swa_full = n_ctx, 512, 512, False
        cp.n_threads = cp.n_threads_batch = n_threads
        self.ctx = ll.llama_init_from_model(self.model, cp)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)

    def p_yes(self, prompt: str, yes: int, no: int) -> float:
        from decider.engines.llama_lib import tokenize_with

        ll = self.ll
        ids = [ll.llama_vocab_bos(self.vocab), *tokenize_with(self.vocab, prompt)]
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        arr = (ll.llama_token * len(ids))(*ids)
        if ll.llama_decode(self.ctx, ll.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")
        row = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ctx, -1), (self.n_vocab,))
        a, b = float(row[yes]), float(row[no])
        return 1.0 / (1.0 + np.exp(b - a))

    def close(self) -> None:
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def run_bench(model: str | None, *, repeat: int, tokens: int, n_threads: int | None = None,
              **options) -> dict:
    """options: Decider's (engine, n_ctx, limits, engine options)."""
    threads = n_threads or os.cpu_count() or 1
    catalog = Catalog()
    options["prefix_cache_bytes"] = 0  # it times the same prompt read again and again
    decider = Decider(model, catalog=catalog, n_threads=threads, **options)
    fmt = decider.planner.format
    tok = decider.engine.tokenize
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    while len(tok(prompt_text(fmt.render_prefix(text, "")))) > tokens - 16:  # with the question
        text = text.rsplit(" ", 1)[0]
    question = YesNo(QUESTIONS[0])
    prompt = prompt_text(fmt.render_prefix(text, "") + question.branches(fmt)[0].suffix)
    raw = RawLlama(str(catalog.locate(decider.entry)), decider.n_ctx, threads)
    yes, no = tok(" yes")[0], tok(" no")[0]
    n_prompt = 1 + len(tok(prompt))
    four = [YesNo(q) for q in QUESTIONS]

    rows = {
        "raw llama-cpp-python, 1 yes/no": _median_ms(lambda: raw.p_yes(prompt, yes, no), repeat),
        "decider, 1 yes/no": _median_ms(lambda: decider.decide(text, [question]), repeat),
        "decider, 4 questions in 1 request": _median_ms(lambda: decider.decide(text, four), repeat),
        "decider, 4 requests of 1 question": _median_ms(
            lambda: [decider.decide(text, [q]) for q in four], repeat),
    }
    raw.close()
    decider.close()
    overhead = rows["decider, 1 yes/no"] / rows["raw llama-cpp-python, 1 yes/no"]
    shared = rows["decider, 4 questions in 1 request"] / rows["decider, 4 requests of 1 question"]
    print(f"model {decider.entry.name} ({decider.engine.name}), prompt {n_prompt} tokens, "
          f"{threads} threads, {repeat} runs each, {_cpu()}")
    print(f"{'workload':<36} {'median ms':>10}")
    for name, ms in rows.items():
        print(f"{name:<36} {ms:>10.1f}")
    print(f"decider / raw (1 yes/no):            {overhead:.3f}  ({100 * (overhead - 1):+.1f}%)")
    print(f"4 questions in 1 / 4 requests:       {shared:.3f}")
    return {"rows": rows, "overhead": overhead, "shared_ratio": shared, "prompt_tokens": n_prompt}


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_engine_bench(model_path: str, engines: Sequence[str], *, repeat: int = 20,
                     prompt_tokens: Sequence[int] = (120, 2000), batch: int = 128,
                     batch_tokens: int = 256, n_ctx: int = 4096, questions: int = 1) -> dict:
    """The same score() work through several engines: a request of `questions` yes/no
    questions about one text at each prompt length (median ms), and `batch` such requests
    of `batch_tokens` tokens in one call (requests/s; with one question, decisions/s).
    An engine is named alone or as name:dtype (reference:bfloat16: transformers in bf16,
    on the GPU when there is one).

    Each engine runs in a fresh process of its own, one after another: no engine's memory
    or GPU libraries are in the process of the next, and one that crashes takes only its
    own column (llama.cpp's CUDA build segfaulted at load on the H200 machine,
    docs/benchmarks.md). The jobs are the same in each: random token ids (speed does not
    depend on them) from one seed, below min(vocabulary, 1000). An engine that fails or
    whose process dies is reported and left out of the table."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    table: dict[str, dict[str, float]] = {}
    for name in engines:
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            run = pool.submit(_bench_engine, model_path, name, repeat, tuple(prompt_tokens),
                              batch, batch_tokens, n_ctx, questions)
            try:
                table[name] = run.result()
            except Exception as e:  # noqa: BLE001 - the other engines still run
                print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
    if not table:
        return table
    names = list(table)
    rows = list(table[names[0]])
    first = names[0]
    print(f"{model_path}, {repeat} runs, medians; ratios: {first} against each other engine")
    print(f"{'workload':<36}" + "".join(f"{e:>14}" for e in names) + "".join(
        f"{first + '/' + e:>20}" for e in names[1:]))
    for r in rows:
        vals = [table[e][r] for e in names]
        print(f"{r:<36}" + "".join(f"{v:>14.2f}" for v in vals) + "".join(
            f"{vals[0] / v:>20.3f}" for v in vals[1:]))
    return table


def random_job(rng: np.random.Generator, vocab: int, n: int, questions: int = 1):
    """A ScoreJob of n random tokens (below `vocab`) after the BOS: the text, then
    `questions` 9-token question suffixes, each a yes/no on tokens 3 and 4."""
    from decider.engines import Branch, ScoreJob

    ids = rng.integers(5, vocab, n).tolist()
    text = n - 9 * questions
    return ScoreJob((2, *ids[:text]), tuple(
        Branch(tuple(ids[text + 9 * q:text + 9 * q + 9]), ((3,), (4,)))
        for q in range(questions)))


def _bench_engine(model_path: str, name: str, repeat: int, prompt_tokens: tuple[int, ...],
                  batch: int, batch_tokens: int, n_ctx: int, questions: int = 1
                  ) -> dict[str, float]:
    """One engine's column of run_engine_bench, in the process that calls it."""
    from decider.engines import load_engine

    kind, _, dtype = name.partition(":")
    options: dict = {"dtype": dtype} if dtype else {}
    if kind == "reference" and dtype:
        import torch

        if torch.cuda.is_available():
            options["device"] = "cuda"
    if kind == "llama":  # every layer on the GPU; a CPU build ignores it
        options["n_gpu_layers"] = -1
    engine = load_engine(kind, model_path, n_ctx, **options)
    print(f"{name}: {engine.info.weights}; memory at n_ctx {n_ctx}: " + ", ".join(
        f"{k} {v / 2**20:.1f} MiB" for k, v in engine.info.memory.items()), flush=True)
    if kind != "llama":  # what the torch engines hold on the GPU in all (tables, buffers)
        import torch

        if torch.cuda.is_available():
            print(f"{name}: GPU memory allocated after load "
                  f"{torch.cuda.memory_allocated() / 2**20:.1f} MiB", flush=True)
    rng = np.random.default_rng(0)
    vocab = min(engine.info.n_vocab, 1000)
    singles = {n: random_job(rng, vocab, n, questions) for n in prompt_tokens}
    many = [random_job(rng, vocab, batch_tokens, questions) for _ in range(batch)]
    col = {f"{questions} yes/no, {n} tokens (ms)": _median_ms(
        lambda j=j: engine.score([j]), repeat) for n, j in singles.items()}
    ms = _median_ms(lambda: engine.score(many), max(3, repeat // 4))
    unit = "decisions/s" if questions == 1 else f"requests of {questions}/s"
    col[f"{batch} x {batch_tokens} tokens ({unit})"] = batch / ms * 1000
    engine.close()
    return col
