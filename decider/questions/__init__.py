"""Request types: a text and the typed questions asked about it. Each question type lives
in a module of its own (yes_no, choice, multi_label, scale) and registers itself here."""

from .base import (
                   ANSWER_TYPES,
                   QUESTION_TYPES,
                   Answer,
                   Label,
                   Limits,
                   Question,
                   Scored,
                   question_type,
)
from .choice import Choice, ChoiceAnswer
from .multi_label import LabelDecision, MultiLabel, MultiLabelAnswer
from .request import Request, request_from_dict
from .scale import Scale, ScaleAnswer
from .yes_no import YesNo, YesNoAnswer

__all__ = ["ANSWER_TYPES", "QUESTION_TYPES", "Answer", "Choice", "ChoiceAnswer", "Label",
           "LabelDecision", "Limits", "MultiLabel", "MultiLabelAnswer", "Question",
           "Request", "Scale", "ScaleAnswer", "Scored", "YesNo", "YesNoAnswer",
           "question_type", "request_from_dict"]
