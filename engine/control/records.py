"""Snapshot and targets records: Python values <-> the payload bytes of engine.control.layout."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvloop.engine.control import layout as L

U32 = 2**32 - 1
U64 = 2**64 - 1

# Snapshot field -> keys of EngineCore.snapshot() that may carry it (first present wins; "a.b" reads
# a nested dict). Components add their keys over time, so every key is optional.
SNAPSHOT_KEYS: dict[str, tuple[str, ...]] = {
    "num_waiting": ("num_waiting",),
    "num_running": ("num_running",),
    "batch_cap": ("batch_cap",),
    "kv_blocks_total": ("kv_blocks_total",),
    "kv_blocks_free": ("kv_blocks_free",),
    "watermark": ("watermark", "kv_watermark", "retention_watermark"),
    "kv_use_device": ("kv_use_device", "kv_usage", "kv_usage.device"),
    "kv_use_host": ("kv_use_host", "kv_usage_host", "kv_usage.host"),
    "kv_use_disk": ("kv_use_disk", "kv_usage_disk", "kv_usage.disk"),
    "prefix_queries_device": ("prefix_queries_device", "kv_query_tokens", "prefix_queries.device"),
    "prefix_queries_host": ("prefix_queries_host", "prefix_queries.host"),
    "prefix_queries_disk": ("prefix_queries_disk", "prefix_queries.disk"),
    "prefix_hits_device": ("prefix_hits_device", "kv_hit_tokens_device", "prefix_hits.device"),
    "prefix_hits_host": ("prefix_hits_host", "kv_hit_tokens_host", "prefix_hits.host"),
    "prefix_hits_disk": ("prefix_hits_disk", "kv_hit_tokens_disk", "prefix_hits.disk"),
    "preemptions": ("num_preemptions", "preemptions"),
    "rejections": ("num_rejections", "num_rejected", "rejections"),
    "oom_events": ("num_oom_events", "oom_events"),
    "requests_finished": ("num_finished", "num_requests_finished", "requests_finished"),
    "tokens_generated": ("num_generated_tokens", "tokens_generated", "generation_tokens"),
    "ttft_p50_s": ("ttft_p50_s",),
    "ttft_p99_s": ("ttft_p99_s",),
}
_FLOATS = {"watermark", "kv_use_device", "kv_use_host", "kv_use_disk", "ttft_p50_s", "ttft_p99_s"}
_U32 = {"num_waiting", "num_running", "batch_cap", "kv_blocks_total", "kv_blocks_free", "_pad"}
_NAN_DEFAULT = {"watermark", "ttft_p50_s", "ttft_p99_s"}  # unknown, as opposed to zero


def _lookup(snap: dict, keys: tuple[str, ...]):
    for key in keys:
        if "." in key:
            outer, inner = key.split(".", 1)
            value = snap.get(outer)
            if isinstance(value, dict) and inner in value:
                return value[inner]
        elif key in snap and not isinstance(snap[key], dict):
            return snap[key]
    return None


def pack_snapshot(snap: dict, start_id: int, step: int, time_ns: int) -> bytes:
    values: list = [start_id & U64, step & U64, time_ns]
    for name in L.SNAPSHOT_FIELDS[3:]:
        raw = _lookup(snap, SNAPSHOT_KEYS.get(name, ()))
        if name in _FLOATS:
            values.append(math.nan if raw is None and name in _NAN_DEFAULT else float(raw or 0.0))
        else:  # clamp: a bad counter must never make the engine's step raise
            values.append(max(0, min(int(raw or 0), U32 if name in _U32 else U64)))
    return L.SNAPSHOT_FMT.pack(*values)


def unpack_snapshot(payload: bytes) -> dict:
    out = dict(zip(L.SNAPSHOT_FIELDS, L.SNAPSHOT_FMT.unpack(payload), strict=True))
    out.pop("_pad")
    return out


@dataclass(frozen=True)
class Targets:
    """Batch cap and retention watermark; None means 'no opinion, keep the engine's own value'."""

    batch_cap: int | None = None
    watermark: float | None = None
    version: int = 0
    time_ns: int = 0
    writer_id: int = 0
    source: str = "sidecar"  # "sidecar" (read from the block) or "default" (the engine's configuration)

    def same_values(self, other: Targets | None) -> bool:
        return other is not None and (self.batch_cap, self.watermark) == (other.batch_cap, other.watermark)


def pack_targets(t: Targets) -> bytes:
    flags = (L.FLAG_BATCH_CAP if t.batch_cap is not None else 0) | (L.FLAG_WATERMARK if t.watermark is not None else 0)
    return L.TARGETS_FMT.pack(t.version & U64, t.time_ns, t.writer_id & U64, flags,
                              max(0, min(int(t.batch_cap or 0), U32)),
                              math.nan if t.watermark is None else float(t.watermark))


def unpack_targets(payload: bytes) -> Targets:
    version, time_ns, writer_id, flags, cap, mark = L.TARGETS_FMT.unpack(payload)
    return Targets(batch_cap=cap if flags & L.FLAG_BATCH_CAP else None,
                   watermark=mark if flags & L.FLAG_WATERMARK else None,
                   version=version, time_ns=time_ns, writer_id=writer_id)
