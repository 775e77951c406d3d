"""The text model architectures the Triton engine runs, by GGUF architecture name."""

from __future__ import annotations

from pathlib import Path


def model_class(arch: str, path: Path | str = ""):
    """The model class (with its `config_class`) of a GGUF architecture."""
    if arch == "gemma3":
        from .gemma3 import Gemma3

        return Gemma3
    if arch == "gemma4":
        from .gemma4 import Gemma4

        return Gemma4
    raise ValueError(f"{path} is a {arch!r} model; supported: gemma3, gemma4")
