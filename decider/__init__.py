"""decider: typed decisions from the label-token logits of a local language model.

The public names below are imported on first use, so that `import decider.errors` (or any
one module) loads nothing else of the package: the CLI, the health check and the engine
process start with only what they need.
"""

from importlib import import_module

__version__ = "0.1.0"

_PUBLIC = {
    "Decision": "answers", "Decider": "api", "DeciderError": "errors",
    **{name: "questions" for name in (
        "Choice", "ChoiceAnswer", "Label", "LabelDecision", "Limits", "MultiLabel",
        "MultiLabelAnswer", "Request", "Scale", "ScaleAnswer", "YesNo", "YesNoAnswer")},
}
__all__ = [*sorted(_PUBLIC), "__version__"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'decider' has no attribute {name!r}")
    value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value
