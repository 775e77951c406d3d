"""decider: typed decisions from the label-token logits of a local language model.

The public names below are imported on first use, so that `import decider.errors` (or any
one module) loads nothing else of the package: the CLI, the health check and the engine
process start with only what they need.
"""

from importlib import import_module

__version__ = "0.1.0"

_PUBLIC = {
    "ChoiceAnswer": "answers", "Decision": "answers", "LabelDecision": "answers",
    "MultiLabelAnswer": "answers", "ScaleAnswer": "answers", "YesNoAnswer": "answers",
    "Decider": "api", "DeciderError": "errors",
    "Choice": "questions", "Label": "questions", "Limits": "questions",
    "MultiLabel": "questions", "Request": "questions", "Scale": "questions",
    "YesNo": "questions",
}
__all__ = [*sorted(_PUBLIC), "__version__"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'decider' has no attribute {name!r}")
    value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value
