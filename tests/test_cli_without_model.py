"""The CLI where no real model loads: bad flags refused before any load, and `decider
bench` on random weights of a made-up shape."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.command import DECIDER


def tiny_shape(monkeypatch, vocab: int) -> None:
    """A made-up two-layer shape "tiny" for `decider bench --shape`, of `vocab` tokens."""
    from decider.bench.random_gguf import SHAPES

    monkeypatch.setitem(SHAPES, "tiny", dict(layers=2, hidden=256, heads=2, kv_heads=1,
                                             head_dim=128, ffn=256, vocab=vocab, window=16))


@pytest.mark.parametrize("engines,tokenizer", [("triton,reference", False), ("triton,llama", True)])
def test_bench_shape_gives_random_weights_a_tokenizer_only_for_llama(monkeypatch, engines,
                                                                     tokenizer):
    """`decider bench --shape`: the llama engine loads no GGUF without a tokenizer (the
    model's is copied); the torch engines score token ids without one, so a benchmark of
    them alone needs no llama.cpp."""
    import argparse

    import gguf

    from decider.commands.bench import bench_model_path

    tiny_shape(monkeypatch, vocab=262144)
    path = bench_model_path(argparse.Namespace(model=None, shape="tiny", engines=engines))
    fields = gguf.GGUFReader(path).fields
    assert ("tokenizer.ggml.model" in fields) is tokenizer
    assert int(fields["gemma3.block_count"].parts[-1][0]) == 2


def test_bench_engines_times_the_prompt_lengths_asked_for(monkeypatch, capsys):
    """`decider bench --engines --shape --prompt-tokens`: one row per length, then the
    batch row, for each engine (here the Triton engine on the CPU, in its own process)."""
    from decider.commands import main

    tiny_shape(monkeypatch, vocab=1024)
    assert main(["bench", "--engines", "triton", "--shape", "tiny", "--prompt-tokens",
                 "40,90", "--repeat", "1", "--n-ctx", "512"]) == 0
    rows = {line.rsplit(None, 1)[0]: float(line.rsplit(None, 1)[1])
            for line in capsys.readouterr().out.splitlines() if "tokens (" in line}
    assert list(rows) == ["1 yes/no, 40 tokens (ms)", "1 yes/no, 90 tokens (ms)",
                          "128 x 256 tokens (decisions/s)"]
    assert all(v > 0 for v in rows.values())


def test_the_bench_job_holds_its_questions_within_its_tokens():
    """`--prompt-tokens 230 --questions 5`: 230 tokens after the BOS, of them a 185-token
    text and five 9-token questions, each a yes/no; the same job the profile uses."""
    import numpy as np

    from decider.bench.engines import random_job

    job = random_job(np.random.default_rng(0), 1000, 230, 5)
    assert len(job.prefix) == 1 + 185 and job.prefix[0] == 2
    assert [len(b.suffix) for b in job.branches] == [9] * 5
    assert all(b.candidates == ((3,), (4,)) for b in job.branches)
    assert all(5 <= t < 1000 for b in job.branches for t in (*job.prefix[1:], *b.suffix))


SERVE_FLAGS = [  # each was taken, or ended in a traceback after the model loaded
    (["--max-batch", "0"], "--max-batch: must be positive"),
    (["--max-queue", "0"], "--max-queue: must be positive"),
    (["--n-ctx", "0"], "--n-ctx: must be at least 32"),
    (["--threads", "0"], "--threads: must be at least 1"),
    (["--threads", "-1"], "--threads: must not be negative"),
    (["--threads", "1000"], "--threads: must be at most"),
    (["--engine", ""], "--engine: must not be empty"),
    (["--engine", "warp"], "--engine: must be one of llama, triton, reference"),
    (["--metrics-port", "99999"], "--metrics-port: must be a port number in [0, 65535]"),
    (["--listen", "127.0.0.1:99999"], "the port in [1, 65535]"),
    (["--max-work-tokens", "-5"], "--max-work-tokens: must not be negative"),
]


SERVE_ONLY = ("--max-batch", "--max-queue", "--metrics-port", "--listen")


@pytest.mark.parametrize("command, flags, words", [
    (command, flags, words) for flags, words in SERVE_FLAGS for command in ("serve", "run")
    if command == "serve" or flags[0] not in SERVE_ONLY])
def test_a_bad_flag_exits_2_naming_it_before_any_model_loads(tmp_path, command, flags, words):
    """Checked as the config file's keys are, before anything loads."""
    args = (["serve", "--listen", f"unix://{tmp_path}/d.sock"] if command == "serve"
            else ["run", "gemma-3-270m", "text", "-q", "Q?"])
    out = without_a_model(tmp_path, *args, *flags)
    assert out.returncode == 2, out.stderr.decode()
    assert words in out.stderr.decode() and out.stdout == b""


def test_a_unix_socket_in_a_missing_directory_is_refused_before_the_model_loads(tmp_path):
    out = without_a_model(tmp_path, "serve", "--listen", f"unix://{tmp_path}/missing/d.sock")
    assert out.returncode == 2
    assert f"the directory '{tmp_path}/missing' does not exist" in out.stderr.decode()
    assert b"Traceback" not in out.stderr


def without_a_model(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`decider ARGS` with an empty cache, which must stay empty: a model load would
    assemble the embedded model into it."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    out = subprocess.run([*DECIDER, *args], capture_output=True,
                         timeout=60, env={**os.environ, "DECIDER_CACHE_DIR": str(cache)})
    assert not list(cache.iterdir()), "a model was loaded"
    return out


def test_a_bad_system_one_file_names_each_field_once(tmp_path):
    """One line a refused field (no line per member of a union), then one summary line."""
    path = tmp_path / "request.json"
    path.write_text('{"model": "gemma-3-270m", "state": "x", "questions": {'
                    '"a": {"type": "noul", "instructions": 5}, '
                    '"b": {"type": "choice", "criteria": {"x": 5}}}}')
    out = without_a_model(tmp_path, "run", "gemma-3-270m", "--systemone", str(path))
    assert out.returncode == 2
    assert out.stderr.decode().splitlines() == [
        "decider: body.questions.a.noul.instructions: Input should be a string, an object "
        "or an array",
        "decider: body.questions.b.choice.criteria.x: Input should be a string, an object or "
        "an array",
        "decider: INVALID_REQUEST: 2 fields refused (above)"]
