"""Whether the Triton engine fits this host and a model: CUDA present (a torch build
with it and Triton installed) and an architecture the engine runs. Imports torch only
when asked, so the CLI can ask before loading anything."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ARCHITECTURES = ("gemma3", "gemma4")  # the model code the triton engine has


def cuda_present() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return False
    import torch

    return torch.cuda.is_available()


def architecture(path: Path) -> tuple[str, bool]:
    """(the model's architecture, whether it is a mixture of experts), from a GGUF's
    metadata or a checkpoint's config.json."""
    if path.is_dir():
        cfg = json.loads((path / "config.json").read_text())
        text = cfg.get("text_config") or cfg
        arch = str(cfg.get("model_type", "")).removesuffix("_text")
        return arch, bool(text.get("enable_moe_block"))
    import gguf  # the gguf reader maps the file; it reads no tensor data here

    fields = gguf.GGUFReader(str(path)).fields
    arch = fields["general.architecture"].contents()
    experts = fields.get(f"{arch}.expert_count")
    return arch, bool(experts is not None and experts.contents())


def triton_fits(path: Path) -> tuple[bool, str]:
    """(whether the triton engine is the one to run `path` here, why)."""
    if not cuda_present():
        return False, "no CUDA device (or no CUDA build of torch and triton)"
    arch, moe = architecture(path)
    if arch not in ARCHITECTURES:
        return False, f"the triton engine has no {arch!r} model code"
    if moe:
        return False, "the triton engine has no mixture-of-experts layers yet"
    return True, f"CUDA present and the triton engine runs {arch}"
