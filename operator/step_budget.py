"""The step token budget's bounds (feedback.stepTokenBudget): one table for the CRD's CEL rules, the
operator's checks of stored objects, and the values rendered into the sidecar's settings.

The budget is the tokens one engine step may process (decode rows plus prefill chunks, vLLM's
max_num_batched_tokens). The engine starts at engine.scheduler.maxNumBatchedTokens and never goes above
it (its scheduler's ceiling); the coordinator moves the live budget within these bounds below it. Unset
bounds are derived from maxNumBatchedTokens, so an object stored before the knob existed stays valid.
"""

from __future__ import annotations

from typing import Any

from kvloop.engine.core.defaults import FEEDBACK_STEP_TOKEN_BUDGET

FLOOR = 16  # tokens: the schema's minimum for the lower bound (and for maxNumBatchedTokens)
DEFAULT_MIN = FEEDBACK_STEP_TOKEN_BUDGET.value.min  # or maxNumBatchedTokens when smaller
DEFAULT_MAX = FEEDBACK_STEP_TOKEN_BUDGET.value.max  # the sidecar's own; the engine's budget caps it below
DEFAULT_MAX_STEP = FEEDBACK_STEP_TOKEN_BUDGET.value.max_step

MIN_ABOVE_MAX = "feedback.stepTokenBudget.min must be <= feedback.stepTokenBudget.max"
ABOVE_CEILING = ("feedback.stepTokenBudget bounds must not exceed engine.scheduler.maxNumBatchedTokens, "
                 "the engine's configured budget and the ceiling of the live one")
MIN_BELOW_FLOOR = f"feedback.stepTokenBudget.min must be at least {FLOOR} tokens"
STEP_NOT_POSITIVE = "feedback.stepTokenBudget.maxStep must be at least 1"

_SCHED = "self.engine.scheduler"
_BUDGET = "self.feedback.stepTokenBudget"


def bounds_rules() -> list[tuple[str, str]]:
    """CEL on the stepTokenBudget object itself."""
    return [("!has(self.min) || !has(self.max) || self.min <= self.max", MIN_ABOVE_MAX)]


def spec_rules() -> list[tuple[str, str]]:
    """CEL on the spec: the bounds that are set lie at or below the engine's budget (chunked prefill only)."""
    tokens = f"{_SCHED}.maxNumBatchedTokens"
    return [(f"!{_SCHED}.chunkedPrefill || ((!has({_BUDGET}.min) || {_BUDGET}.min <= {tokens}) && "
             f"(!has({_BUDGET}.max) || {_BUDGET}.max <= {tokens}))", ABOVE_CEILING)]


def resolved(spec: dict[str, Any]) -> dict[str, int]:
    """{min, max, max_step} of a defaulted spec, as the sidecar's settings file takes them. No initial: the
    coordinator starts from the engine's own budget (maxNumBatchedTokens), clamped into the bounds. No max
    where the sidecar's own (DEFAULT_MAX) already lies above the engine's budget, which caps it: so the
    defaults render what `kvloop sidecar` runs with."""
    sched = spec["engine"]["scheduler"]
    raw = spec["feedback"].get("stepTokenBudget") or {}
    ceiling = int(sched["maxNumBatchedTokens"])
    step = int(raw.get("maxStep", DEFAULT_MAX_STEP))
    if not sched["chunkedPrefill"]:
        # No chunking: a whole prompt must fit one step, as the engine sizes it (at least the
        # context length), so the budget stays where the engine puts it.
        fixed = max(ceiling, int(spec["engine"]["maxModelLen"]))
        return {"min": fixed, "max": fixed, "max_step": step}
    high = int(raw.get("max", ceiling))
    out = {"min": int(raw.get("min", min(DEFAULT_MIN, high))), "max_step": step}
    if "max" in raw or high > DEFAULT_MAX:
        out["max"] = high
    return out


def problems(spec: dict[str, Any]) -> list[str]:
    """The CRD's checks, for objects stored without them: the same messages, with the values."""
    raw = spec["feedback"].get("stepTokenBudget") or {}
    out: list[str] = []
    if "min" in raw and raw["min"] < FLOOR:
        out.append(f"{MIN_BELOW_FLOOR} (it is {raw['min']})")
    if "maxStep" in raw and raw["maxStep"] < 1:
        out.append(f"{STEP_NOT_POSITIVE} (it is {raw['maxStep']})")
    if "min" in raw and "max" in raw and raw["min"] > raw["max"]:
        out.append(f"{MIN_ABOVE_MAX} (min {raw['min']}, max {raw['max']})")
    ceiling = spec["engine"]["scheduler"]["maxNumBatchedTokens"]
    above = [f"{k} {raw[k]}" for k in ("min", "max") if k in raw and raw[k] > ceiling]
    if spec["engine"]["scheduler"]["chunkedPrefill"] and above:
        out.append(f"{ABOVE_CEILING} ({', '.join(above)}; maxNumBatchedTokens {ceiling})")
    return out
