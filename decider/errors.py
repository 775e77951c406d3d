"""The errors decider raises: each carries a stable reason and machine-readable details.

The gRPC service maps them to status codes and the CLI to exit codes, both from the
`kind` of the error, so every front end reports the same failure the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Path = tuple[str | int, ...]  # a field's place: ("questions", 1, "labels", 0)


@dataclass(frozen=True, slots=True)
class FieldViolation:
    path: Path  # a bare name is a path of one
    description: str

    def __post_init__(self) -> None:
        if isinstance(self.path, str):
            object.__setattr__(self, "path", (self.path,))

    @property
    def field(self) -> str:
        """The path written out: "questions[1].labels[0]"."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
        return out


class DeciderError(Exception):
    """Base class. `reason` is an UPPER_SNAKE constant; `metadata` holds string details;
    `violations` the bad fields of a refused request (none for other errors)."""

    kind = "internal"  # invalid not_found out_of_range exhausted unavailable deadline
    # cancelled internal
    reason = "INTERNAL"
    # the request was in an engine when it failed: a client's automatic retry could take
    # a request that hangs or kills engines to the next one (gRPC is told not to retry)
    reached_engine = False
    violations: tuple[FieldViolation, ...] = ()

    def __init__(self, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = {k: str(v) for k, v in metadata.items()}

    def __reduce__(self):
        """Pickled as its state: subclasses take other arguments than the message."""
        return rebuild, (type(self).__name__, self.message, self.metadata, self.violations)


def rebuild(name: str, message: str, metadata: dict[str, str],
            violations: Sequence[FieldViolation] = ()) -> DeciderError:
    """An error of this module from its state, as another process sent it
    (decider.service.messages) or pickle kept it."""
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, DeciderError)):
        cls = DeciderError
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.message, error.metadata = message, dict(metadata)
    if violations:
        error.violations = tuple(violations)
    return error


class InvalidRequest(DeciderError):
    """A request field is missing, malformed or over a limit."""

    kind = "invalid"
    reason = "INVALID_REQUEST"

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))


class ConfigError(DeciderError):
    """Bad load-time configuration: unknown engine, n_ctx out of bounds, bad catalog entry."""

    kind = "invalid"
    reason = "INVALID_CONFIG"


class CalibrationMismatch(ConfigError):
    """A calibration fitted for another model file or another prompt template."""

    reason = "CALIBRATION_MISMATCH"

    def __init__(self, origin: str, what: str, fitted: str, loaded: str) -> None:
        super().__init__(f"the calibration {origin} was fitted for {what} {fitted}, not the "
                         f"loaded {loaded}: calibrate again on this model", fitted=fitted,
                         loaded=loaded)


class ModelNotFound(DeciderError):
    kind = "not_found"
    reason = "MODEL_NOT_FOUND"


class ModelCorrupt(ModelNotFound):
    """A model file on disk is not the file its catalog entry describes."""

    reason = "MODEL_CORRUPT"

    def __init__(self, name: str, path: object, what: str, repair: str) -> None:
        super().__init__(f"model {name!r}: {path} is corrupt ({what}); {repair}",
                         model=name, path=path)


class PromptTooLong(DeciderError):
    """The prompt does not fit the loaded window; decider never truncates."""

    kind = "out_of_range"
    reason = "PROMPT_TOO_LONG"

    def __init__(self, prompt_tokens: int, n_ctx: int, where: str = "") -> None:
        at = f" ({where})" if where else ""
        super().__init__(
            f"prompt is {prompt_tokens} tokens{at}, over the loaded window n_ctx={n_ctx}; "
            "shorten the text or load the model with a larger --n-ctx",
            prompt_tokens=prompt_tokens,
            n_ctx=n_ctx,
        )

    @property
    def prompt_tokens(self) -> int:
        return int(self.metadata["prompt_tokens"])

    @property
    def n_ctx(self) -> int:
        return int(self.metadata["n_ctx"])


class WorkTooLarge(DeciderError):
    """The tokens a request's engine call would place are over the work bound."""

    kind = "out_of_range"
    reason = "WORK_TOO_LARGE"

    def __init__(self, work_tokens: int, limit: int) -> None:
        super().__init__(
            f"the request needs {work_tokens} tokens of engine work, over the limit of "
            f"{limit} (max_work_tokens: --max-work-tokens, or [limits] max_work_tokens in "
            "the config file); ask fewer questions or give fewer or shorter labels",
            work_tokens=work_tokens, max_work_tokens=limit,
        )


class EngineNoLogits(DeciderError):
    """The engine returned rows no forward pass wrote (sentinel, zeros, stale or non-finite)."""

    kind = "internal"
    reason = "ENGINE_RETURNED_NO_LOGITS"

    def __init__(self, tell: str) -> None:
        super().__init__(
            "the engine returned no logits: the GPU pass failed, most likely out of memory "
            f"({tell})",
            tell=tell,
        )


class ActivationOverflow(DeciderError):
    """A pass's activations went past the range of the engine's activation dtype."""

    kind = "out_of_range"
    reason = "ACTIVATION_OVERFLOW"

    def __init__(self, dtype: str, limit: float) -> None:
        super().__init__(
            f"an activation of this pass went past {dtype}'s limit of {limit:g}; load the "
            'model with dtype "bfloat16" ([model] dtype in the config, or --dtype)',
            dtype=dtype, limit=limit,
        )


class EngineOutOfMemory(DeciderError):
    kind = "exhausted"
    reason = "ENGINE_OUT_OF_MEMORY"


class EngineFailure(DeciderError):
    kind = "internal"
    reason = "ENGINE_FAILURE"


class QueueFull(DeciderError):
    kind = "exhausted"
    reason = "QUEUE_FULL"


class Unavailable(DeciderError):
    """Not serving now: loading, draining, or reloading after an engine failure."""

    kind = "unavailable"
    reason = "UNAVAILABLE"


class EngineDied(Unavailable):
    """The engine process ended while holding the request; a new one is on its way."""

    reason = "ENGINE_DIED"
    reached_engine = True

    def __init__(self, exit_code: int | None) -> None:
        how = (f"was killed by signal {-exit_code}" if exit_code is not None and exit_code < 0
               else f"exited with code {exit_code}")
        super().__init__(f"the engine process {how} while this request waited; a new one "
                         "is starting: retry shortly", exit_code=exit_code)


class EngineHung(Unavailable):
    """The engine process showed no sign of progress for longer than its limit: it was
    killed while holding the request, and a new one is starting."""

    reason = "ENGINE_HUNG"
    reached_engine = True

    def __init__(self, silent_seconds: float, limit_seconds: float) -> None:
        super().__init__(f"the engine process made no progress for {silent_seconds:.1f} s "
                         f"(engine_call_limit_seconds {limit_seconds:g}) and was replaced "
                         "while this request waited; retry shortly",
                         silent_seconds=round(silent_seconds, 1), limit_seconds=limit_seconds)


class ServerStopping(Unavailable):
    """The daemon is stopping and this request could not finish within the grace."""

    reason = "SERVER_STOPPING"

    def __init__(self, grace_seconds: float) -> None:
        super().__init__(f"the server is stopping and this request could not finish within "
                         f"the {grace_seconds:g} s grace; retry against another replica or "
                         "after the restart", grace_seconds=grace_seconds)


class DeadlineExceeded(DeciderError):
    kind = "deadline"
    reason = "DEADLINE_EXCEEDED"


class Cancelled(DeciderError):
    """The caller went away; its answer would reach no one."""

    kind = "cancelled"
    reason = "CANCELLED"
