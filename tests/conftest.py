"""Shared fixtures: the real embedded model, assembled once into a per-run cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decider.catalog import Catalog


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Without a GPU the Triton kernels are tested in Triton's interpreter, which must be on
# before anything imports triton (transformers does, for the reference engine).
if not _cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """A private cache for the run: the embedded model is assembled into it once."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["DECIDER_CACHE_DIR"] = str(path)
    os.environ["DECIDER_CATALOG"] = str(path / "no-user-catalog.toml")
    return path


@pytest.fixture(scope="session")
def catalog(cache_dir) -> Catalog:
    return Catalog(cache_dir=cache_dir)


@pytest.fixture(scope="session")
def model_path(catalog) -> Path:
    return catalog.locate(catalog.get("gemma-3-270m"))


@pytest.fixture(scope="session")
def decider(model_path, catalog):
    from decider import Decider

    with Decider("gemma-3-270m", catalog=catalog, n_ctx=2048) as d:
        yield d


@pytest.fixture
def rng(request) -> "np.random.Generator":
    """A fresh random generator per test; its seed is printed (shown on failure) and
    DECIDER_TEST_SEED=N replays it."""
    import numpy as np

    seed = int(os.environ.get("DECIDER_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
    print(f"{request.node.nodeid}: seed {seed} (replay: DECIDER_TEST_SEED={seed})")
    return np.random.default_rng(seed)


@pytest.fixture
def fault_file(tmp_path, monkeypatch) -> Path:
    """The engine fault hook: write a fault name here and the next pass takes it."""
    path = tmp_path / "fault"
    monkeypatch.setenv("DECIDER_FAULT_FILE", str(path))
    return path


@pytest.fixture
def run_cli(model_path):
    """Run the real `decider` executable; returns the CompletedProcess."""

    def run(*args: str, stdin: bytes | None = None, env: dict | None = None):
        return subprocess.run(
            [sys.executable, "-m", "decider.cli", *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            env={**os.environ, **(env or {})},
            timeout=300,
        )

    return run
