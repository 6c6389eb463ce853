"""Snapshot and targets records: typed values <-> the payload bytes of engine.control.layout."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from kvloop.engine.control import layout as L

if TYPE_CHECKING:
    from kvloop.engine.core.snapshot import EngineSnapshot

U32 = 2**32 - 1
U64 = 2**64 - 1


@dataclass(frozen=True)
class ControlRecord:
    """The engine's snapshot as the control block carries it (layout.SNAPSHOT_FIELDS, less the padding),
    plus `age_s`, which the reader sets: how old the record was when it was read."""

    start_id: int
    step: int
    time_ns: int
    num_waiting: int
    num_running: int
    num_decoding: int  # running rows past their prefill
    batch_cap: int
    step_token_budget: int  # tokens one step may schedule, now
    step_token_budget_max: int  # the engine's configured budget: the knob's ceiling
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_pending: int  # blocks the running rows' prompts still need (the rest of their prefill)
    block_size: int
    max_model_len: int
    watermark: float
    kv_use_device: float
    kv_use_host: float
    kv_use_disk: float
    prefix_queries_device: int
    prefix_queries_host: int
    prefix_queries_disk: int
    prefix_hits_device: int
    prefix_hits_host: int
    prefix_hits_disk: int
    preemptions: int
    rejections: int
    oom_events: int
    requests_finished: int
    tokens_generated: int
    ttft_p50_s: float  # NaN until a request has started
    ttft_p99_s: float
    tpot_p50_s: float  # NaN until a request has finished with two tokens or more
    tpot_p99_s: float
    age_s: float = 0.0

    def as_dict(self) -> dict:
        """JSON-ready: NaN becomes None."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


_PAYLOAD_FIELDS = tuple(f.name for f in fields(ControlRecord) if f.name != "age_s")
assert _PAYLOAD_FIELDS == tuple(n for n in L.SNAPSHOT_FIELDS if n != "_pad"), "ControlRecord and layout disagree"
_U32 = {"num_waiting", "num_running", "num_decoding", "batch_cap", "step_token_budget", "step_token_budget_max",
        "kv_blocks_total", "kv_blocks_free", "kv_blocks_pending", "block_size", "max_model_len", "_pad"}
_FLOATS = {"watermark", "kv_use_device", "kv_use_host", "kv_use_disk", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
           "tpot_p99_s"}
UNKNOWN = (math.nan, math.nan)


def control_record(snap: EngineSnapshot, ttft: tuple[float, float] = UNKNOWN, tpot: tuple[float, float] = UNKNOWN,
                   *, start_id: int = 0, step: int = 0, time_ns: int = 0) -> ControlRecord:
    """The record of an engine snapshot, with the (P50, P99) of TTFT and TPOT the engine's hook keeps."""
    return ControlRecord(
        start_id=start_id, step=step, time_ns=time_ns,
        num_waiting=snap.num_waiting, num_running=snap.num_running, num_decoding=snap.num_decoding,
        batch_cap=snap.batch_cap, step_token_budget=snap.step_token_budget,
        step_token_budget_max=snap.step_token_budget_max, kv_blocks_total=snap.kv_blocks_total,
        kv_blocks_free=snap.kv_blocks_free, kv_blocks_pending=snap.kv_blocks_pending, block_size=snap.block_size,
        max_model_len=snap.max_model_len, watermark=snap.watermark,
        kv_use_device=snap.kv_usage, kv_use_host=snap.kv_use("host") or 0.0, kv_use_disk=snap.kv_use("disk") or 0.0,
        prefix_queries_device=snap.prefix_queries("device"), prefix_queries_host=snap.prefix_queries("host"),
        prefix_queries_disk=snap.prefix_queries("disk"), prefix_hits_device=snap.prefix_hits("device"),
        prefix_hits_host=snap.prefix_hits("host"), prefix_hits_disk=snap.prefix_hits("disk"),
        preemptions=snap.num_preemptions, rejections=snap.num_rejections, oom_events=snap.num_oom_events,
        requests_finished=snap.requests_finished, tokens_generated=snap.tokens_generated,
        ttft_p50_s=ttft[0], ttft_p99_s=ttft[1], tpot_p50_s=tpot[0], tpot_p99_s=tpot[1],
    )


def pack_record(rec: ControlRecord) -> bytes:
    values: list = []
    for name in L.SNAPSHOT_FIELDS:
        raw = 0 if name == "_pad" else getattr(rec, name)
        if name in _FLOATS:
            values.append(float(raw))
        elif name == "time_ns":
            values.append(int(raw))
        else:  # clamp: a bad counter must never make the engine's step raise
            values.append(max(0, min(int(raw), U32 if name in _U32 else U64)))
    return L.SNAPSHOT_FMT.pack(*values)


def unpack_record(payload: bytes, age_s: float = 0.0) -> ControlRecord:
    values = dict(zip(L.SNAPSHOT_FIELDS, L.SNAPSHOT_FMT.unpack(payload), strict=True))
    values.pop("_pad")
    return ControlRecord(**values, age_s=age_s)


@dataclass(frozen=True)
class Targets:
    """Batch cap, retention watermark and step token budget; None means 'no opinion, keep the engine's own
    value'."""

    batch_cap: int | None = None
    watermark: float | None = None
    step_token_budget: int | None = None
    version: int = 0
    time_ns: int = 0
    writer_id: int = 0
    source: str = "sidecar"  # "sidecar" (read from the block) or "default" (the engine's configuration)

    def same_values(self, other: Targets | None) -> bool:
        return other is not None and self.values() == other.values()

    def values(self) -> tuple:
        return self.batch_cap, self.watermark, self.step_token_budget


def pack_targets(t: Targets) -> bytes:
    flags = ((L.FLAG_BATCH_CAP if t.batch_cap is not None else 0) | (L.FLAG_WATERMARK if t.watermark is not None else 0)
             | (L.FLAG_STEP_TOKEN_BUDGET if t.step_token_budget is not None else 0))
    return L.TARGETS_FMT.pack(t.version & U64, t.time_ns, t.writer_id & U64, flags,
                              max(0, min(int(t.batch_cap or 0), U32)),
                              math.nan if t.watermark is None else float(t.watermark),
                              max(0, min(int(t.step_token_budget or 0), U32)), 0)


def unpack_targets(payload: bytes) -> Targets:
    version, time_ns, writer_id, flags, cap, mark, budget, _ = L.TARGETS_FMT.unpack(payload)
    return Targets(batch_cap=cap if flags & L.FLAG_BATCH_CAP else None,
                   watermark=mark if flags & L.FLAG_WATERMARK else None,
                   step_token_budget=budget if flags & L.FLAG_STEP_TOKEN_BUDGET else None,
                   version=version, time_ns=time_ns, writer_id=writer_id)
