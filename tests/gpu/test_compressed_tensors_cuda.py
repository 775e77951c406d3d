"""A compressed-tensors W4A16 checkpoint (written by the library, group 32 and 128) on
CUDA: the engine (fp16 by default) against the fp32 reference on the same directory, to the GGUF
test's bound (p_yes within 0.02, the same decisions)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("compressed_tensors", reason="the library writes the checkpoints")

from decider.engines import load_engine  # noqa: E402
from helpers.checkpoints import write_checkpoint  # noqa: E402
from helpers.yes_no_jobs import assert_p_yes_close  # noqa: E402


@pytest.mark.parametrize("group", [32, 128])
def test_on_cuda_keeps_p_yes_within_0_02(tmp_path, group, rng):
    path = write_checkpoint(tmp_path / "ckpt", rng, group=group)
    reference = load_engine("reference", path, 512)
    engine = load_engine("triton", path, 512, device="cuda")
    assert_p_yes_close(engine, reference, rng)
    engine.close()
    reference.close()
