"""Backends behind one Engine protocol. Importing this package imports no backend."""

from __future__ import annotations

from importlib import import_module
from inspect import Parameter, signature
from pathlib import Path

from decider.errors import ConfigError

from .base import (
    Branch,
    BranchResult,
    Engine,
    EngineInfo,
    JobResult,
    NodeLogits,
    ScoreJob,
    Stop,
    label_trie,
)

# the `dtype` option of the torch engines (triton, reference): their activations
DTYPES = ("bfloat16", "float16", "float32")
# name -> "module:class", imported only when that engine is loaded
ENGINES = {
    "llama": "decider.engines.llama:LlamaEngine",
    "triton": "decider.engines.triton_engine:TritonEngine",
    "reference": "decider.engines.reference:ReferenceEngine",
}


def load_engine(name: str, model_path: str | Path, n_ctx: int | None, **options) -> Engine:
    """Load `model_path` into the engine called `name` with a per-sequence window n_ctx
    (None: the engine's default, never above the model's trained context)."""
    engine_cls = engine_class(name)
    takes = engine_options(engine_cls)
    for option in options:
        if option not in takes:
            raise ConfigError(f"the {name} engine has no option {option!r}; it takes "
                              f"{', '.join(takes)}", engine=name, option=option)
    return engine_cls(model_path, n_ctx, **options)


def engine_class(name: str) -> type:
    target = ENGINES.get(name)
    if target is None:
        raise ConfigError(f"unknown engine {name!r}; available: {', '.join(sorted(ENGINES))}",
                          engine=name)
    module, cls = target.split(":")
    try:
        return getattr(import_module(module), cls)
    except ImportError as e:
        raise ConfigError(f"engine {name!r} is not installed: {e}", engine=name) from e


def engine_options(engine_cls: type) -> list[str]:
    """The keyword options an engine class takes."""
    return [p.name for p in signature(engine_cls).parameters.values()
            if p.kind is Parameter.KEYWORD_ONLY]


__all__ = ["DTYPES", "ENGINES", "Branch", "BranchResult", "Engine", "EngineInfo", "JobResult",
           "NodeLogits", "ScoreJob", "Stop", "label_trie", "engine_class", "engine_options",
           "load_engine"]
