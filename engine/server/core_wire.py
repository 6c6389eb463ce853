"""What the API process and the engine core process say to each other over their pipe.

To the core: the AsyncEngine's inbox messages (AddRequest, AbortRequest) plus CoreCall and Stop, pickled by
multiprocessing (adds pickle as fast as msgspec encodes them, and a call carries a function).
From the core: frames of bytes whose first byte says what follows. A step's outputs, the hot path, are
msgspec msgpack (about twice pickle's messages/s for 64 and 256 rows); everything else is pickled."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.scheduler.scheduler import RequestRejected
from kvloop.engine.server.async_engine import RequestFailed

OUTPUTS = b"o"  # msgspec: list[RequestOutput], one step's
EVENT = b"e"  # pickle: one of the events below


@dataclass(frozen=True)
class CoreCall:
    """fn(engine_core) between steps; fn must pickle (a module-level function or a partial of one)."""

    call_id: int
    fn: Callable


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class CoreInfo:
    """What the API process needs to know of the engine it fronts: sent once the core is built."""

    model_name: str
    max_model_len: int
    vocab_size: int
    cache_config: dict
    pid: int


# ---- events from the core (pickled) ------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """Warmed up: /ready may answer 200."""


@dataclass(frozen=True)
class Snapshot:
    snapshot: Any  # EngineSnapshot


@dataclass(frozen=True)
class Failed:
    """A request the core could not add, as the exception the thread backend raises: kind "rejected"
    (RequestRejected, detail its reason), "invalid" (ValueError) or "failed" (RequestFailed, detail its
    stage). Sent as fields: RequestRejected does not unpickle."""

    request_id: str
    kind: str
    message: str
    detail: str | None = None

    @classmethod
    def of(cls, request_id: str, exc: BaseException) -> Failed:
        if isinstance(exc, RequestRejected):
            return cls(request_id, "rejected", str(exc), exc.reason)
        if isinstance(exc, ValueError):
            return cls(request_id, "invalid", str(exc))
        return cls(request_id, "failed", str(exc), getattr(exc, "stage", None))

    def exception(self) -> BaseException:
        if self.kind == "rejected":
            return RequestRejected(self.detail or "invalid", self.message)
        if self.kind == "invalid":
            return ValueError(self.message)
        return RequestFailed(self.message, self.detail)


@dataclass(frozen=True)
class CallResult:
    call_id: int
    ok: bool
    value: Any  # the result, or the exception


@dataclass(frozen=True)
class Died:
    reason: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[RequestOutput])


def encode_outputs(outputs: list[RequestOutput]) -> bytes:
    """The API reads only the new tokens and text of an unfinished output: its whole text and token ids so
    far (which grow with every step) stay in the core."""
    for out in outputs:
        if not out.finished:
            out.text, out.token_ids = "", []
    return OUTPUTS + _encoder.encode(outputs)


def encode_event(event: object) -> bytes:
    """The event pickled; a call's result or exception that does not pickle (or unpickle) travels as a
    RuntimeError with its text, so a reply always arrives."""
    if not isinstance(event, CallResult):
        return EVENT + pickle.dumps(event)
    try:
        data = pickle.dumps(event)
        pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - an odd exception class or result: send its text instead
        value = event.value if isinstance(event.value, BaseException) else exc
        failure = RuntimeError(f"{type(value).__name__}: {value}")
        data = pickle.dumps(CallResult(event.call_id, False, failure))
    return EVENT + data


def decode(frame: bytes) -> list[RequestOutput] | object:
    """A list of outputs, or an event."""
    body = memoryview(frame)[1:]
    if frame[:1] == OUTPUTS:
        return _decoder.decode(body)
    return pickle.loads(body)
