"""decider: typed decisions from the label-token logits of a local language model."""

__version__ = "0.1.0"

from .answers import (  # noqa: E402
    ChoiceAnswer,
    Decision,
    LabelDecision,
    MultiLabelAnswer,
    ScaleAnswer,
    YesNoAnswer,
)
from .api import Decider  # noqa: E402
from .errors import DeciderError  # noqa: E402
from .questions import Choice, Label, Limits, MultiLabel, Request, Scale, YesNo  # noqa: E402

__all__ = [
    "Choice", "ChoiceAnswer", "Decider", "DeciderError", "Decision", "Label", "LabelDecision",
    "Limits", "MultiLabel", "MultiLabelAnswer", "Request", "Scale", "ScaleAnswer", "YesNo",
    "YesNoAnswer", "__version__",
]
