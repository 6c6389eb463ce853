"""The control block's two payloads, field by field: one table each (name, type, clamp, where the value
comes from, what it means). layout.py takes the struct formats from them, records.py the record types,
the snapshot-to-record mapping and the packing, and the docs their field lists (`describe`).

Types are struct codes, little-endian: Q u64, q i64, I u32, d f64. Clamp: integers saturate to their
type's range when packed (a bad counter must never make the engine's step raise); a target's knob value
outside its knob's range (engine/core/knobs.py) makes the engine ignore the whole record."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from kvloop.engine.core.knobs import KNOBS, Knob
from kvloop.engine.core.slo import MISS_REASONS

U32 = 2**32 - 1
U64 = 2**64 - 1
_RANGES: dict[str, tuple[int, int]] = {"I": (0, U32), "Q": (0, U64)}
PAD = "_pad"


@dataclass(frozen=True)
class Field:
    name: str
    code: str  # struct code
    doc: str
    # snapshot fields: the value in an EngineSnapshot (None: the writer gives it: ids, clock, percentiles)
    read: Callable[[Any], Any] | None = None
    knob: Knob | None = None  # targets: the knob this field carries, whose range a value must lie in

    @property
    def clamp(self) -> tuple[int, int] | None:
        """The range an integer saturates to when packed (None: q and d, packed as they are)."""
        return _RANGES.get(self.code)

    def pack(self, value: Any) -> float | int:
        """The value as the struct takes it: a float (None: NaN), or an integer clamped to its type."""
        if self.code == "d":
            return math.nan if value is None else float(value)
        v = int(value or 0)
        lo_hi = self.clamp
        return v if lo_hi is None else max(lo_hi[0], min(v, lo_hi[1]))

    def admits(self, value: Any) -> bool:
        """A target's value: within its knob's range (fields without a knob take any value)."""
        return self.knob is None or self.knob.admits(value)


def _snap(name: str, code: str, doc: str, read: Callable[[Any], Any] | None = None) -> Field:
    return Field(name, code, doc, read or attrgetter(name))


def _tier(what: str, tier: str) -> Field:
    def read(s: Any) -> int:
        return getattr(s, what)(tier)

    return Field(f"{what}_{tier}", "Q", f"{what.replace('_', ' ')} of the {tier} tier (tokens, cumulative; "
                 "engine.core.kv_stats)", read)


def _use(tier: str) -> Field:
    return Field(f"kv_use_{tier}", "d", f"share of the {tier} tier in use (0 without one)",
                 lambda s: s.kv_use(tier) or 0.0)


SNAPSHOT: tuple[Field, ...] = (
    Field("start_id", "Q", "random per engine start: the sidecar starts over when it changes"),
    Field("step", "Q", "records published since the engine started"),
    Field("time_ns", "q", "CLOCK_REALTIME of the write"),
    _snap("num_waiting", "I", "requests waiting"),
    _snap("num_running", "I", "requests running"),
    _snap("num_decoding", "I", "running rows past their prefill"),
    _snap("batch_cap", "I", "the batch cap now"),
    _snap("step_token_budget", "I", "tokens one step may schedule, now"),
    _snap("step_token_budget_max", "I", "the engine's configured budget: the knob's ceiling"),
    _snap("kv_blocks_total", "I", "blocks of the device pool"),
    _snap("kv_blocks_free", "I", "blocks no request holds (free plus cached)"),
    _snap("kv_blocks_pending", "I", "blocks the running rows' prompts still need (their prefill's rest)"),
    _snap("block_size", "I", "tokens per block"),
    _snap("max_model_len", "I", "longest request (prompt + output) in tokens"),
    Field(PAD, "I", "zero (aligns the doubles)", lambda s: 0),
    _snap("watermark", "d", "the retention watermark now"),
    Field("kv_use_device", "d", "share of the device pool held by running requests", attrgetter("kv_usage")),
    _use("host"),
    _use("disk"),
    *(_tier("prefix_queries", t) for t in ("device", "host", "disk")),
    *(_tier("prefix_hits", t) for t in ("device", "host", "disk")),
    _snap("preemptions", "Q", "preemptions (cumulative)", attrgetter("num_preemptions")),
    _snap("rejections", "Q", "requests refused at add (cumulative)", attrgetter("num_rejections")),
    _snap("oom_events", "Q", "static mode's reservations that did not fit (cumulative)",
          attrgetter("num_oom_events")),
    _snap("requests_finished", "Q", "requests finished, any reason (cumulative)"),
    _snap("tokens_generated", "Q", "output tokens of the finished requests (cumulative)"),
    _snap("slo_good", "Q", "finished requests that met the SLO (cumulative; engine.core.slo)"),
    *(Field(f"slo_missed_{r}", "Q", f"finished requests that missed the SLO by {r} (cumulative)",
            lambda s, r=r: s.slo_missed.get(r, 0)) for r in MISS_REASONS),
    _snap("slo_slack_count", "Q", "judged requests with a first token (cumulative): slo_slack_sum's count"),
    _snap("slo_slack_sum", "d", "sum of those requests' SLO slack (1 instant, 0 at the bound, < 0 missed)"),
    Field("ttft_p50_s", "d", "time to first token, P50 over a recent window (NaN until a request started)"),
    Field("ttft_p99_s", "d", "time to first token, P99"),
    Field("tpot_p50_s", "d", "time per output token after the first, P50 of recently finished requests (NaN "
          "until one finished with two tokens or more)"),
    Field("tpot_p99_s", "d", "time per output token, P99"),
)


def _knob_field(k: Knob) -> Field:
    return Field(k.name, "I" if k.kind is int else "d", f"{k.doc} ({k.unit}; valid in {k.bounds()})", knob=k)


TARGETS_HEAD: tuple[Field, ...] = (
    Field("version", "Q", "increases with every write; a reader ignores one lower than it has applied"),
    Field("time_ns", "q", "CLOCK_REALTIME of the write"),
    Field("writer_id", "Q", "random per writer process"),
    Field("flags", "I", "bit i set: knob i (the fields below, in order) carries a value"),
)
TARGET_KNOBS: tuple[Field, ...] = tuple(_knob_field(k) for k in KNOBS)
_TARGET_BYTES = sum({"Q": 8, "q": 8, "I": 4, "d": 8}[f.code] for f in TARGETS_HEAD + TARGET_KNOBS)
_TARGET_PAD = (Field(PAD, "I", "zero"),) if _TARGET_BYTES % 8 else ()  # whole 8-byte words
TARGETS: tuple[Field, ...] = TARGETS_HEAD + TARGET_KNOBS + _TARGET_PAD


def describe(fields: tuple[Field, ...]) -> str:
    """The table as the docs list it: one line per field."""
    return "\n".join(f"    {f.name:24} {f.code}  {f.doc}" for f in fields)
