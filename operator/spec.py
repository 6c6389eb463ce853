"""The InferenceService spec with its defaults filled in, and the checks that the schema cannot do.

The API server applies the CRD's defaults, but the operator does not rely on that (kmock, older
objects, hand-written tests): `with_defaults` fills the same values. DEFAULTS is the one place the
operator writes them (the CRD schema reads it), from the table in engine/core/defaults.py wherever the
engine or the sidecar has the same default, so an empty InferenceService runs what `kvloop serve` and
`kvloop sidecar` run. `problems` lists reasons a schema-valid spec cannot be realised; the operator
reports them as a Degraded condition.
"""

from __future__ import annotations

import copy
from typing import Any

from kvloop.engine.core import defaults as D
from kvloop.engine.core.policy import DEFAULT_POLICY
from kvloop.operator import step_budget
from kvloop.operator.constants import EMBEDDED_MODEL_NAME
from kvloop.operator.limits import (
    SIDECAR_FLOORS,
    image_problems,
    memory_problems,
    quantity_or_none,
    resource_problems,
)
from kvloop.operator.remote_store import remote_problems

# kvloop serve --speculation's default, once the engine's table has it; until then the operator renders the
# key only when the spec sets it, so an empty InferenceService still runs kvloop serve's configuration.
SPECULATION: D.Default | None = getattr(D, "SPECULATION", None)
SPECULATION_MODES = ("auto", "ngram", "off")


def _bounds(d: D.Default) -> dict[str, Any]:
    return {"min": d.value.min, "max": d.value.max, "maxStep": d.value.max_step}


DEFAULTS: dict[str, Any] = {
    "replicas": 1,
    "model": {"source": "embedded", "name": EMBEDDED_MODEL_NAME},
    "engine": {
        "device": D.DEVICE.value,
        "dtype": D.DTYPE.value,
        "blockSize": D.BLOCK_SIZE.value,
        "maxModelLen": D.MAX_MODEL_LEN.value,
        **({"speculation": SPECULATION.value} if SPECULATION is not None else {}),
        "scheduler": {"mode": DEFAULT_POLICY, "maxNumSeqs": D.BATCH_CAP.value,
                      "maxNumBatchedTokens": D.STEP_TOKEN_BUDGET.value, "chunkedPrefill": True},
        "kvCache": {
            "devicePoolMiB": D.DEVICE_POOL_MIB.value,
            "hostPoolMiB": D.HOST_POOL_MIB.value,
            "admitMinRequests": D.ADMIT_MIN_REQUESTS.value,
            "hostAdmitMinRequests": D.HOST_ADMIT_MIN_REQUESTS.value,
            "minPrefixTokens": D.MIN_PREFIX_TOKENS.value,
            "retentionWatermark": D.RETENTION_WATERMARK.value,
            "disk": {"enabled": False, "storage": "emptyDir", "sizeGiB": 10},
        },
    },
    "feedback": {
        "mode": D.FEEDBACK_MODE.value,
        "intervalSeconds": int(D.FEEDBACK_PERIOD_S.value),
        "staleAfterSeconds": int(D.CONTROL_STALE_AFTER_S.value),
        "batchCap": _bounds(D.FEEDBACK_BATCH_CAP),
        "watermark": _bounds(D.FEEDBACK_WATERMARK),
        # min and max have no fixed default: step_budget.resolved derives them from maxNumBatchedTokens.
        "stepTokenBudget": {"maxStep": step_budget.DEFAULT_MAX_STEP},
        "eventPath": {"enabled": True},
        # no objectives by default (engine/core/defaults.py says why); maxQueueDepth 0: any queue counts
        "targets": {"maxQueueDepth": D.FEEDBACK_MAX_QUEUE_DEPTH.value},
    },
    # what a good request is (engine/core/slo.py): the engine counts finishes against it, the coordinator
    # steers on the counts
    "slo": {"ttftSeconds": D.SLO_TTFT_BASE_S.value,
            "ttftPerThousandPromptTokensSeconds": D.SLO_TTFT_PER_1K_S.value,
            "tpotSeconds": D.SLO_TPOT_S.value},
    "observability": {"logLevel": "info", "serviceMonitor": {"enabled": False, "interval": "30s"}},
    # mode none: a plain Service; InferencePool: the Gateway API Inference Extension's pool and picker
    "routing": {"mode": "none", "inferencePool": {"prefixScoring": "estimated"}},
    "service": {"type": "ClusterIP", "port": 8000},
    "podDisruptionBudget": {"maxUnavailable": 1},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_defaults(spec: dict[str, Any] | None) -> dict[str, Any]:
    return _merge(DEFAULTS, dict(spec or {}))


def quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity as a number (bytes, cores, devices); None when absent or malformed."""
    parsed = quantity_or_none(value)
    return None if parsed is None else float(parsed)


def gpu_count(spec: dict[str, Any]) -> int:
    res = spec.get("resources") or {}
    for part in ("limits", "requests"):
        value = quantity((res.get(part) or {}).get("nvidia.com/gpu"))
        if value:
            return int(value)
    return 0


def problems(spec: dict[str, Any]) -> list[str]:
    """Reasons this (defaulted) spec cannot be realised, each a sentence for the Degraded message."""
    out: list[str] = []
    engine, kv = spec["engine"], spec["engine"]["kvCache"]
    gpus = gpu_count(spec)
    if engine["device"] == "cuda" and gpus == 0:
        out.append("engine.device is cuda but resources request no nvidia.com/gpu")
    if engine["device"] == "cpu" and gpus > 0:
        out.append("engine.device is cpu but resources request nvidia.com/gpu; the GPUs would sit idle")
    # The CRD's CEL rules refuse these at apply time; kept for objects stored before the rules existed.
    out += resource_problems("resources", spec.get("resources"), {})
    out += resource_problems("sidecarResources", spec.get("sidecarResources"), SIDECAR_FLOORS)
    out += memory_problems(spec)
    out += image_problems(spec.get("images"))
    sched = engine["scheduler"]
    if spec["feedback"]["batchCap"]["max"] > sched["maxNumSeqs"] * 4:
        out.append("feedback.batchCap.max is more than 4x engine.scheduler.maxNumSeqs")
    if sched["maxNumBatchedTokens"] < engine["blockSize"]:
        out.append("engine.scheduler.maxNumBatchedTokens is smaller than one KV block")
    out += step_budget.problems(spec)
    out += slo_problems(spec["slo"])
    out += remote_problems(spec)
    disk = kv["disk"]
    if disk["enabled"] and disk["storage"] == "pvc" and not disk.get("claimName"):
        # The CEL rule rejects this too; kept for objects written before the rule existed.
        out.append("engine.kvCache.disk.storage is pvc but claimName is not set")
    return out


# field -> (lowest value, highest value): the CRD's bounds (crd.py reads them), the engine's Slo refuses
# a bound of 0 for TTFT and TPOT; no per-token allowance (0) is a flat TTFT objective
SLO_BOUNDS: dict[str, tuple[float, float]] = {
    "ttftSeconds": (0.001, 3600.0),
    "ttftPerThousandPromptTokensSeconds": (0.0, 3600.0),
    "tpotSeconds": (0.001, 60.0),
}


def slo_problems(slo: dict[str, Any]) -> list[str]:
    """The CRD's ranges, for objects that skipped the schema: the engine would refuse to start."""
    return [f"slo.{key} must be between {lo:g} and {hi:g}" for key, (lo, hi) in SLO_BOUNDS.items()
            if not lo <= slo[key] <= hi]
