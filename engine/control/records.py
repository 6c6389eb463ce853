"""Snapshot and targets records: typed values <-> the payload bytes of engine.control.layout.

Both record types are made from the field tables in fields.py: `ControlRecord` has one attribute per
snapshot field (less the padding) plus `age_s`; `Targets` one per knob (engine/core/knobs.py) plus the
write's version, time and writer."""

from __future__ import annotations

import math
from dataclasses import asdict, field, make_dataclass
from typing import TYPE_CHECKING, Any

from kvloop.engine.control import fields as F
from kvloop.engine.control import layout as L
from kvloop.engine.core.knobs import KNOBS

if TYPE_CHECKING:
    from kvloop.engine.core.snapshot import EngineSnapshot

UNKNOWN = (math.nan, math.nan)
_PAYLOAD = tuple(f for f in F.SNAPSHOT if f.name != F.PAD)
_KNOB_NAMES = tuple(k.name for k in KNOBS)


def _type(f: F.Field) -> type:
    return float if f.code == "d" else int


def _as_dict(self) -> dict:
    """JSON-ready: NaN becomes None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


ControlRecord = make_dataclass(
    "ControlRecord",
    [(f.name, _type(f)) for f in _PAYLOAD] + [("age_s", float, field(default=0.0))],
    frozen=True,
    namespace={"__module__": __name__, "as_dict": _as_dict,
               "__doc__": "The engine's snapshot as the control block carries it (fields.SNAPSHOT, less the "
                          "padding), plus `age_s`, which the reader sets: how old the record was when read."},
)


def control_record(snap: EngineSnapshot, ttft: tuple[float, float] = UNKNOWN,
                   tpot: tuple[float, float] = UNKNOWN,
                   *, start_id: int = 0, step: int = 0, time_ns: int = 0) -> ControlRecord:
    """The record of an engine snapshot, with the (P50, P99) of TTFT and TPOT the engine's hook keeps."""
    given = {"start_id": start_id, "step": step, "time_ns": time_ns, "ttft_p50_s": ttft[0],
             "ttft_p99_s": ttft[1], "tpot_p50_s": tpot[0], "tpot_p99_s": tpot[1]}
    return ControlRecord(**{f.name: given[f.name] if f.read is None else f.read(snap) for f in _PAYLOAD})


def pack_record(rec: ControlRecord) -> bytes:
    return L.SNAPSHOT_FMT.pack(*(f.pack(0 if f.name == F.PAD else getattr(rec, f.name)) for f in F.SNAPSHOT))


def unpack_record(payload: bytes, age_s: float = 0.0) -> ControlRecord:
    values = dict(zip(L.SNAPSHOT_FIELDS, L.SNAPSHOT_FMT.unpack(payload), strict=True))
    values.pop(F.PAD)
    return ControlRecord(**values, age_s=age_s)


def _same_values(self, other: Targets | None) -> bool:
    return other is not None and self.values() == other.values()


def _values(self) -> tuple:
    """The knobs' values in KNOBS order (None: no opinion)."""
    return tuple(getattr(self, name) for name in _KNOB_NAMES)


def _knob_values(self) -> dict[str, Any]:
    return dict(zip(_KNOB_NAMES, self.values(), strict=True))


Targets = make_dataclass(
    "Targets",
    [(name, Any, field(default=None)) for name in _KNOB_NAMES]
    + [("version", int, field(default=0)), ("time_ns", int, field(default=0)),
       ("writer_id", int, field(default=0)),
       # "sidecar" (read from the block) or "default" (the engine's configured values)
       ("source", str, field(default="sidecar"))],
    frozen=True,
    namespace={"__module__": __name__, "same_values": _same_values, "values": _values,
               "knob_values": _knob_values,
               "__doc__": "One value per knob (engine/core/knobs.py: batch cap, retention watermark, step "
                          "token budget, speculation cap); None means 'no opinion, keep the engine's own "
                          "value'."},
)


def pack_targets(t: Targets) -> bytes:
    values = t.values()
    flags = sum(1 << i for i, v in enumerate(values) if v is not None)
    given = {"version": t.version, "time_ns": t.time_ns, "writer_id": t.writer_id, "flags": flags,
             **t.knob_values(), F.PAD: 0}
    return L.TARGETS_FMT.pack(*(f.pack(given[f.name]) for f in F.TARGETS))


def unpack_targets(payload: bytes) -> Targets:
    raw = dict(zip(L.TARGETS_FIELDS, L.TARGETS_FMT.unpack(payload), strict=True))
    flags = raw["flags"]
    knobs = {name: raw[name] if flags & (1 << i) else None for i, name in enumerate(_KNOB_NAMES)}
    return Targets(**knobs, version=raw["version"], time_ns=raw["time_ns"], writer_id=raw["writer_id"])


def admitted(t: Targets) -> bool:
    """Every knob value the targets carry lies within its knob's range, and they carry one at least."""
    values = t.knob_values()
    if all(v is None for v in values.values()):
        return False
    return all(v is None or f.admits(v) for f, v in zip(F.TARGET_KNOBS, values.values(), strict=True))
