"""Reads the metric values out of an engine snapshot, whatever generation of keys it carries.

The snapshot grows as components land (the KV manager's keys are prefixed `kv_`, the scheduler adds its
own), so every value has a list of candidate keys and a default; per-label splits accept a dict
(`{key}_by_{label}`) or flat `{key}_{value}` keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Snapshot = Mapping[str, object]
TIERS = ("device", "host", "disk")


def num(value, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def first(snap: Snapshot, *keys: str, default: float = 0.0) -> float:
    for key in keys:
        if key in snap and isinstance(snap[key], int | float):
            return num(snap[key])
    return default


def split(snap: Snapshot, keys: tuple[str, ...], label: str, values: tuple[str, ...]) -> dict[str, float]:
    """The first of keys present as a dict `{key}_by_{label}` or as flat `{key}_{value}` entries."""
    for key in keys:
        by = snap.get(f"{key}_by_{label}")
        if isinstance(by, Mapping):
            return {str(k): num(v) for k, v in by.items()}
        flat = {v: num(snap[f"{key}_{v}"]) for v in values if f"{key}_{v}" in snap}
        if flat:
            return flat
    return {}


@dataclass
class EngineStats:
    waiting: float = 0.0
    running: float = 0.0
    batch_cap: float = 0.0
    watermark: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)  # per tier, 0..1
    queries: float = 0.0  # prompt tokens looked up in the prefix cache
    hits: dict[str, float] = field(default_factory=dict)  # per tier, tokens
    preemptions: dict[str, float] = field(default_factory=dict)  # per kind
    oom_events: float = 0.0
    evictions: dict[str, float] = field(default_factory=dict)  # per tier
    demotions: dict[str, float] = field(default_factory=dict)  # per destination tier
    promotions: dict[str, float] = field(default_factory=dict)  # per source tier
    admissions_refused: float = 0.0
    eviction_regret: float = 0.0
    cache_config: dict[str, str] = field(default_factory=dict)
    prefix_cache: bool = False


def _tier_use(snap: Snapshot, tier: str) -> float | None:
    total = first(snap, f"kv_{tier}_blocks_total")
    if total > 0:
        return first(snap, f"kv_{tier}_blocks_used") / total
    return None


def read(snap: Snapshot) -> EngineStats:
    s = EngineStats()
    s.waiting, s.running = first(snap, "num_waiting"), first(snap, "num_running")
    s.batch_cap = first(snap, "batch_cap")
    s.watermark = first(snap, "watermark", "kv_watermark", "retention_watermark")
    s.usage = split(snap, ("kv_usage", "kv_use"), "tier", TIERS) or {"device": first(snap, "kv_usage", "kv_use_device")}
    for tier in ("host", "disk"):
        use = _tier_use(snap, tier)
        if use is not None and tier not in s.usage:
            s.usage[tier] = use
    s.queries = first(snap, "prefix_cache_queries", "kv_query_tokens")
    s.hits = split(snap, ("prefix_cache_hits", "kv_hit_tokens"), "tier", TIERS) or {
        "device": first(snap, "prefix_cache_hits")}
    total_preempt = first(snap, "num_preemptions", "preemptions")
    s.preemptions = split(snap, ("num_preemptions", "preemptions"), "kind", ("swap", "recompute")) or {
        "recompute": total_preempt}
    s.oom_events = first(snap, "num_oom_events", "oom_events")
    s.evictions = {"device": first(snap, "kv_evictions", "evictions"), "host": first(snap, "kv_host_evictions"),
                   "disk": first(snap, "kv_disk_evictions")}
    s.demotions = split(snap, ("kv_demotions", "demotions"), "tier", TIERS) or {"host": first(snap, "demotions")}
    s.promotions = split(snap, ("kv_promotions", "promotions"), "tier", TIERS) or {"host": first(snap, "promotions")}
    s.admissions_refused = first(snap, "kv_admissions_refused", "admissions_refused")
    s.eviction_regret = first(snap, "kv_eviction_regret", "eviction_regret")
    mode = snap.get("kv_mode")
    if isinstance(mode, str):
        s.cache_config["mode"] = mode
    s.prefix_cache = bool(snap.get("prefix_cache_enabled")) or (isinstance(mode, str) and mode != "continuous")
    return s
