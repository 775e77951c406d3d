"""Shared fixtures: the real embedded model, assembled once into a per-run cache; the
run's random seed and the seeded generators drawn from it; Hypothesis's profiles.

Random data: every test that draws it takes the `rng` fixture (numpy, and torch's global
generator seeded alike). The run's seed is printed in the header and each test's seed
in its output; DECIDER_TEST_SEED=N replays a run (Hypothesis too: it gets the same seed
unless --hypothesis-seed is given). Hypothesis profiles, by DECIDER_HYPOTHESIS_PROFILE:
"ci" (the default: 500 examples a property) and "deep" (20,000 a property, 100,000 or
more in all: tests/test_parsers.py says how to run it).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from decider.catalog import Catalog

RUN_SEED = int(os.environ.get("DECIDER_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)

for name, examples in (("ci", 500), ("deep", 20_000)):
    settings.register_profile(name, max_examples=examples, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DECIDER_HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = str(RUN_SEED)


def pytest_report_header(config):
    return (f"random seed {RUN_SEED}: DECIDER_TEST_SEED={RUN_SEED} replays this run; "
            f"Hypothesis profile {settings.get_current_profile_name()!r}")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy generator seeded from the run's seed and the test's id (so a test's data
    does not depend on which tests ran before it); torch's global generator gets the same
    seed when torch is loaded. The seed is printed: pytest shows it with a failure."""
    key = f"{RUN_SEED}:{request.node.nodeid}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:4], "little")
    print(f"rng seed {seed} (DECIDER_TEST_SEED={RUN_SEED})")
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    return np.random.default_rng(seed)


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
