from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Label(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class YesNo(_message.Message):
    __slots__ = ("threshold",)
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    def __init__(self, threshold: _Optional[float] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class MultiLabel(_message.Message):
    __slots__ = ("labels", "threshold")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    threshold: float
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., threshold: _Optional[float] = ...) -> None: ...

class Scale(_message.Message):
    __slots__ = ("levels",)
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    levels: _containers.RepeatedCompositeFieldContainer[Label]
    def __init__(self, levels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ...) -> None: ...

class Question(_message.Message):
    __slots__ = ("question", "yes_no", "choice", "multi_label", "scale", "abstain_below", "min_label_mass")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    YES_NO_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    MULTI_LABEL_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    ABSTAIN_BELOW_FIELD_NUMBER: _ClassVar[int]
    MIN_LABEL_MASS_FIELD_NUMBER: _ClassVar[int]
    question: str
    yes_no: YesNo
    choice: Choice
    multi_label: MultiLabel
    scale: Scale
    abstain_below: float
    min_label_mass: float
    def __init__(self, question: _Optional[str] = ..., yes_no: _Optional[_Union[YesNo, _Mapping]] = ..., choice: _Optional[_Union[Choice, _Mapping]] = ..., multi_label: _Optional[_Union[MultiLabel, _Mapping]] = ..., scale: _Optional[_Union[Scale, _Mapping]] = ..., abstain_below: _Optional[float] = ..., min_label_mass: _Optional[float] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("model", "text", "questions", "instructions")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    instructions: str
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ..., instructions: _Optional[str] = ...) -> None: ...

class YesNoAnswer(_message.Message):
    __slots__ = ("p_yes", "decision", "threshold")
    P_YES_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    p_yes: float
    decision: bool
    threshold: float
    def __init__(self, p_yes: _Optional[float] = ..., decision: _Optional[bool] = ..., threshold: _Optional[float] = ...) -> None: ...

class LabelProbability(_message.Message):
    __slots__ = ("label", "p")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    label: str
    p: float
    def __init__(self, label: _Optional[str] = ..., p: _Optional[float] = ...) -> None: ...

class ChoiceAnswer(_message.Message):
    __slots__ = ("label", "confidence", "probabilities")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    label: str
    confidence: float
    probabilities: _containers.RepeatedCompositeFieldContainer[LabelProbability]
    def __init__(self, label: _Optional[str] = ..., confidence: _Optional[float] = ..., probabilities: _Optional[_Iterable[_Union[LabelProbability, _Mapping]]] = ...) -> None: ...

class LabelDecision(_message.Message):
    __slots__ = ("label", "p", "chosen", "label_mass")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    LABEL_MASS_FIELD_NUMBER: _ClassVar[int]
    label: str
    p: float
    chosen: bool
    label_mass: float
    def __init__(self, label: _Optional[str] = ..., p: _Optional[float] = ..., chosen: _Optional[bool] = ..., label_mass: _Optional[float] = ...) -> None: ...

class MultiLabelAnswer(_message.Message):
    __slots__ = ("labels", "chosen", "threshold")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelDecision]
    chosen: _containers.RepeatedScalarFieldContainer[str]
    threshold: float
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelDecision, _Mapping]]] = ..., chosen: _Optional[_Iterable[str]] = ..., threshold: _Optional[float] = ...) -> None: ...

class ScaleAnswer(_message.Message):
    __slots__ = ("level", "expected_index", "probabilities", "confidence")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    level: str
    expected_index: float
    probabilities: _containers.RepeatedCompositeFieldContainer[LabelProbability]
    confidence: float
    def __init__(self, level: _Optional[str] = ..., expected_index: _Optional[float] = ..., probabilities: _Optional[_Iterable[_Union[LabelProbability, _Mapping]]] = ..., confidence: _Optional[float] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ("question", "label_mass", "yes_no", "choice", "multi_label", "scale", "calibrated", "raw", "abstained", "abstain_reason")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    LABEL_MASS_FIELD_NUMBER: _ClassVar[int]
    YES_NO_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    MULTI_LABEL_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    ABSTAINED_FIELD_NUMBER: _ClassVar[int]
    ABSTAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    question: str
    label_mass: float
    yes_no: YesNoAnswer
    choice: ChoiceAnswer
    multi_label: MultiLabelAnswer
    scale: ScaleAnswer
    calibrated: bool
    raw: Answer
    abstained: bool
    abstain_reason: str
    def __init__(self, question: _Optional[str] = ..., label_mass: _Optional[float] = ..., yes_no: _Optional[_Union[YesNoAnswer, _Mapping]] = ..., choice: _Optional[_Union[ChoiceAnswer, _Mapping]] = ..., multi_label: _Optional[_Union[MultiLabelAnswer, _Mapping]] = ..., scale: _Optional[_Union[ScaleAnswer, _Mapping]] = ..., calibrated: _Optional[bool] = ..., raw: _Optional[_Union[Answer, _Mapping]] = ..., abstained: _Optional[bool] = ..., abstain_reason: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "window_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    window_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., window_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "compute_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    compute_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("decider_version", "engine", "model", "model_sha256", "template_version")
    DECIDER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    decider_version: str
    engine: str
    model: str
    model_sha256: str
    template_version: str
    def __init__(self, decider_version: _Optional[str] = ..., engine: _Optional[str] = ..., model: _Optional[str] = ..., model_sha256: _Optional[str] = ..., template_version: _Optional[str] = ...) -> None: ...

class DecideResponse(_message.Message):
    __slots__ = ("answers", "usage", "timings", "provenance")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[Answer]
    usage: Usage
    timings: Timings
    provenance: Provenance
    def __init__(self, answers: _Optional[_Iterable[_Union[Answer, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ...) -> None: ...

class DecideBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[DecideRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[DecideRequest, _Mapping]]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DecideBatchItem(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: DecideResponse
    error: ItemError
    def __init__(self, response: _Optional[_Union[DecideResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class DecideBatchResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DecideBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[DecideBatchItem, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "engine", "loaded", "is_default", "n_ctx", "n_ctx_train", "weights", "model_sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    N_CTX_FIELD_NUMBER: _ClassVar[int]
    N_CTX_TRAIN_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    engine: str
    loaded: bool
    is_default: bool
    n_ctx: int
    n_ctx_train: int
    weights: str
    model_sha256: str
    def __init__(self, name: _Optional[str] = ..., engine: _Optional[str] = ..., loaded: _Optional[bool] = ..., is_default: _Optional[bool] = ..., n_ctx: _Optional[int] = ..., n_ctx_train: _Optional[int] = ..., weights: _Optional[str] = ..., model_sha256: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...
