"""The run's random seed and the generators drawn from it: conftest's `rng` fixture, and
fixtures of a wider scope through `seeded`. DECIDER_TEST_SEED=N replays a run."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

RUN_SEED = int(os.environ.get("DECIDER_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)


def seeded(name: str) -> np.random.Generator:
    """A generator for `name` (a test's or a fixture's id), seeded from the run's seed and
    the name, so its data does not depend on what ran before; torch's global generator
    gets the same seed when torch is loaded. Prints the seed (pytest shows it with a
    failure)."""
    seed = int.from_bytes(hashlib.sha256(f"{RUN_SEED}:{name}".encode()).digest()[:4], "little")
    print(f"rng seed {seed} for {name} (DECIDER_TEST_SEED={RUN_SEED})")
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    return np.random.default_rng(seed)
