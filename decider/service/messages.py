"""Every message between the daemon's processes, typed: msgspec Structs, each union tagged
by the message's class, encoded as MessagePack. Both ends of each channel import this
module and nothing else of the other.

    front end -> engine loop (ZeroMQ)   Score, Cancel        a list of them per send
    engine loop -> front end (ZeroMQ)   Answered, Refused    a list of them per call
    engine process <-> supervisor       Ready, Failed; Ping, Stop          (its pipe)
    supervisor -> front-end worker      Serve, Down, Stop                  (its pipe)

The label logits travel as raw float32 bytes (a MessagePack extension) and come back as
numpy arrays over the received buffer: not copied. Errors travel as their class name,
message and details, and are rebuilt as the same DeciderError on the other side.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import msgspec
import numpy as np

from .. import errors
from ..engines import EngineInfo, ScoreJob
from ..engines.base import BranchResult
from ..errors import DeciderError, FieldViolation
from ..questions import Limits

_LOGITS = 1  # the extension code of a float32 array


class ModelFacts(msgspec.Struct, frozen=True):
    """What the front ends need of the loaded model, sent once it is ready."""

    name: str  # catalog name
    description: str
    release_date: str  # YYYY-MM-DD: the model file's date stands for it
    engine: str
    info: EngineInfo
    sha256: str
    prompt_format: str  # with info.chat_template, what a front end builds the format from
    template_version: str
    calibration: dict | None = None  # the loaded calibration's JSON, for every front end

    @classmethod
    def of(cls, decider) -> ModelFacts:
        """The facts of a loaded Decider."""
        info = decider.engine.info
        mtime = Path(info.model_path).stat().st_mtime
        day = datetime.datetime.fromtimestamp(mtime, datetime.UTC).date().isoformat()
        return cls(decider.entry.name, decider.entry.description, day, decider.engine.name,
                   info, decider.model_sha256, decider.entry.prompt_format,
                   decider.template_version,
                   decider.calibration and decider.calibration.to_json())


class WireError(msgspec.Struct, array_like=True):
    """A DeciderError on its way to another process."""

    name: str  # its class, in decider.errors
    message: str
    metadata: dict[str, str]
    violations: list[FieldViolation] = []

    @classmethod
    def of(cls, e: DeciderError) -> WireError:
        return cls(type(e).__name__, e.message, e.metadata, list(e.violations))

    def error(self) -> DeciderError:
        return errors.rebuild(self.name, self.message, self.metadata, self.violations)


# -- the engine socket ----------------------------------------------------------------------

class Score(msgspec.Struct, tag=True, array_like=True):
    rid: int  # the front end's id for the request
    deadline: float  # time.monotonic(), system-wide
    sent: float  # when the front end sent it: queue time counts from there
    job: ScoreJob


class Cancel(msgspec.Struct, tag=True, array_like=True):
    rid: int


class Answered(msgspec.Struct, tag=True, array_like=True):
    rid: int
    results: list[BranchResult]  # guarded raw label logits, one result a branch
    queue_ms: float
    compute_ms: float
    cached_tokens: int = 0  # of the prefix, read from the engine's prefix cache


class Refused(msgspec.Struct, tag=True, array_like=True):
    rid: int
    error: WireError


# -- the pipes ----------------------------------------------------------------------------

class Ready(msgspec.Struct, tag=True):
    facts: ModelFacts


class Failed(msgspec.Struct, tag=True):
    error: WireError


class Ping(msgspec.Struct, tag=True):
    pass


class Stop(msgspec.Struct, tag=True):
    pass


class Serve(msgspec.Struct, tag=True):
    facts: ModelFacts
    address: str  # the engine process's socket
    limits: Limits


class Down(msgspec.Struct, tag=True):
    error: WireError  # what the requests held are refused with


class Listening(msgspec.Struct, tag=True):  # a front-end process to the daemon
    pass


def _encode_logits(obj):
    if isinstance(obj, np.ndarray):
        return msgspec.msgpack.Ext(_LOGITS, obj.astype(np.float32, copy=False).tobytes())
    raise NotImplementedError(f"cannot send a {type(obj).__name__}")


def _decode_logits(code: int, data: memoryview) -> np.ndarray:
    return np.frombuffer(data, np.float32)


encode = msgspec.msgpack.Encoder(enc_hook=_encode_logits).encode
to_engine = msgspec.msgpack.Decoder(list[Score | Cancel]).decode
from_engine = msgspec.msgpack.Decoder(list[Answered | Refused], ext_hook=_decode_logits).decode
control = msgspec.msgpack.Decoder(Ready | Failed | Ping | Stop).decode
to_worker = msgspec.msgpack.Decoder(Serve | Down | Stop).decode
from_worker = msgspec.msgpack.Decoder(Listening).decode
