"""Pure status computation: conditions from the Deployment's status, feedback from pod annotations.

Conditions follow the Kubernetes API conventions and kstatus: `Ready`, `Progressing`, `Degraded`
and `FeedbackHealthy`, plus kstatus' abnormal-true pair `Reconciling` (= Progressing) and
`Stalled` (= Degraded), so Flux and other kstatus readers see InProgress / Failed / Current
without a custom health check. `observedGeneration` is set only by the reconcile handler.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from kvloop.operator import constants as C

MAX_PODS_IN_STATUS = 32


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def condition(ctype: str, status: bool | None, reason: str, message: str, generation: int | None,
              previous: list[dict[str, Any]] | None, now: dt.datetime) -> dict[str, Any]:
    value = "Unknown" if status is None else ("True" if status else "False")
    prev = next((c for c in previous or [] if c.get("type") == ctype), None)
    changed = prev is None or prev.get("status") != value
    return {"type": ctype, "status": value, "reason": reason, "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": rfc3339(now) if changed else prev.get("lastTransitionTime", rfc3339(now))}


def deployment_state(deploy: dict[str, Any] | None, desired: int) -> tuple[str, str, int]:
    """(state, message, readyReplicas) with state one of Missing, Progressing, Failed, Available."""
    if deploy is None:
        return "Missing", "Deployment not created yet", 0
    st = deploy.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    for cond in st.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            message = f"rollout exceeded its progress deadline: {cond.get('message', '')}".strip()
            return "Failed", message, ready
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return "Failed", f"replica failure: {cond.get('message', '')}".strip(), ready
    gen = (deploy.get("metadata") or {}).get("generation")
    if gen is not None and int(st.get("observedGeneration") or 0) < int(gen):
        return "Progressing", "waiting for the Deployment controller to observe the new spec", ready
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    if updated < desired:
        return "Progressing", f"{updated} of {desired} replicas updated", ready
    if total > updated:
        return "Progressing", f"{total - updated} old replicas pending termination", ready
    if available < desired or ready < desired:
        return "Progressing", f"{min(available, ready)} of {desired} replicas available", ready
    return "Available", f"{ready} of {desired} replicas ready", ready


def _pod_feedback(pod: dict[str, Any], now: dt.datetime, stale_after: float) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    entry: dict[str, Any] = {"pod": meta.get("name", "")}
    raw = (meta.get("annotations") or {}).get(C.FEEDBACK_ANNOTATION)
    if raw is None:
        return {**entry, "state": "Missing"}
    try:
        data = json.loads(raw)
        entry.update(batchCap=int(data["batchCap"]), watermark=float(data["watermark"]),
                     mode=str(data["mode"]),
                     converged=bool(data.get("converged", False)), updatedAt=str(data["updatedAt"]))
        if isinstance(data.get("hitRate"), int | float):  # optional: prefix-cache hit rate last period
            entry["hitRate"] = float(data["hitRate"])
        if data.get("stepTokenBudget") is not None:  # optional: sidecars from before the knob lack it
            entry["stepTokenBudget"] = int(data["stepTokenBudget"])
        last = data.get("lastDecision")
        if isinstance(last, dict) and last.get("at"):
            entry["lastDecision"] = {"knob": str(last.get("knob", "")), "reason": str(last.get("reason", "")),
                                     "at": str(last["at"])}
    except (ValueError, KeyError, TypeError):
        return {**entry, "state": "Invalid"}
    updated = parse_time(entry["updatedAt"])
    if updated is None:
        return {**entry, "state": "Invalid"}
    entry["state"] = "Stale" if (now - updated).total_seconds() > stale_after else "Fresh"
    return entry


def running_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not (p.get("metadata") or {}).get("deletionTimestamp")]


def aggregate_feedback(pods: list[dict[str, Any]], spec: dict[str, Any], now: dt.datetime
                       ) -> tuple[dict[str, Any], tuple[bool | None, str, str]]:
    """status.feedback and the FeedbackHealthy (status, reason, message) from the pods' annotations."""
    fb = spec["feedback"]
    stale_after = max(float(fb["staleAfterSeconds"]), 2.0 * fb["intervalSeconds"])
    entries = sorted((_pod_feedback(p, now, stale_after) for p in running_pods(pods)), key=lambda e: e["pod"])
    counts = {s: sum(e["state"] == s for e in entries) for s in ("Fresh", "Stale", "Missing", "Invalid")}
    reporting = [e for e in entries if e["state"] in ("Fresh", "Stale")]
    decisions = [{**e["lastDecision"], "pod": e["pod"]} for e in reporting if "lastDecision" in e]
    last = max(decisions, key=lambda d: parse_time(d["at"]) or now, default=None)
    summary: dict[str, Any] = {
        "mode": fb["mode"],
        "pods": [{k: v for k, v in e.items()} for e in entries[:MAX_PODS_IN_STATUS]],
        "reportingPods": len(reporting),
        "convergedPods": sum(bool(e.get("converged")) for e in reporting),
        "stalePods": counts["Stale"],
    }
    if reporting:
        caps = [e["batchCap"] for e in reporting]
        marks = [e["watermark"] for e in reporting]
        summary["batchCap"] = {"min": min(caps), "max": max(caps)}
        summary["watermark"] = {"min": min(marks), "max": max(marks)}
        budgets = [e["stepTokenBudget"] for e in reporting if "stepTokenBudget" in e]
        if budgets:
            summary["stepTokenBudget"] = {"min": min(budgets), "max": max(budgets)}
        rates = [e["hitRate"] for e in reporting if "hitRate" in e]
        if rates:
            summary["hitRate"] = round(sum(rates) / len(rates), 4)
    if last is not None:
        summary["lastDecision"] = last
    if fb["mode"] == "off":
        return summary, (True, "FeedbackDisabled", "feedback mode is off")
    if not entries:
        return summary, (None, "NoRunningPods", "no running pods to read feedback from")
    if counts["Invalid"]:
        return summary, (False, "InvalidAnnotation",
                         f"{counts['Invalid']} pod(s) carry an unreadable {C.FEEDBACK_ANNOTATION} annotation")
    if counts["Missing"]:
        return summary, (False, "NotReporting",
                         f"{counts['Missing']} of {len(entries)} running pod(s) report no feedback")
    if counts["Stale"]:
        return summary, (False, "StaleFeedback",
                         f"{counts['Stale']} of {len(entries)} pod(s) have not updated feedback for over "
                         f"{int(stale_after)}s")
    return summary, (True, "AllPodsReporting",
                     f"{len(entries)} pod(s) reporting, {summary['convergedPods']} converged")


def compute_status(*, name: str, namespace: str, spec: dict[str, Any], deploy: dict[str, Any] | None,
                   pods: list[dict[str, Any]], problems: list[str], apply_error: str | None,
                   previous: dict[str, Any] | None, generation: int | None, observed_generation: int | None,
                   now: dt.datetime | None = None) -> dict[str, Any]:
    now = now or now_utc()
    prev_conds = (previous or {}).get("conditions") or []
    desired = int(spec["replicas"])
    state, message, ready = deployment_state(deploy, desired)
    if problems:
        degraded = (True, "SpecNotRealisable", "; ".join(problems))
    elif apply_error:
        degraded = (True, "ApplyFailed", apply_error)
    elif state == "Failed":
        degraded = (True, "RolloutFailed", message)
    else:
        degraded = (False, "AsExpected", "no problems found")
    progressing = state in ("Missing", "Progressing") and not problems
    prog = (progressing,
            "RolloutInProgress" if progressing else ("RolloutComplete" if state == "Available" else state),
            message)
    is_ready = state == "Available" and not degraded[0]
    ready_reason = "AllReplicasReady" if is_ready else ("Degraded" if degraded[0] else "RolloutInProgress")
    ready_msg = message if not degraded[0] else degraded[2]
    feedback, fb_health = aggregate_feedback(pods, spec, now)
    gen = generation
    conds = [
        condition("Ready", is_ready, ready_reason, ready_msg, gen, prev_conds, now),
        condition("Progressing", prog[0], prog[1], prog[2], gen, prev_conds, now),
        condition("Degraded", degraded[0], degraded[1], degraded[2], gen, prev_conds, now),
        condition("FeedbackHealthy", fb_health[0], fb_health[1], fb_health[2], gen, prev_conds, now),
        condition("Reconciling", prog[0], prog[1], prog[2], gen, prev_conds, now),
        condition("Stalled", degraded[0], degraded[1], degraded[2], gen, prev_conds, now),
    ]
    port = spec["service"]["port"]
    return {
        "observedGeneration": observed_generation,
        "conditions": conds,
        "replicas": int(((deploy or {}).get("status") or {}).get("replicas") or 0),
        "readyReplicas": ready,
        "selector": ",".join(f"{k}={v}" for k, v in C.selector_labels(name).items()),
        "url": f"http://{name}.{namespace}.svc.cluster.local:{port}/v1",
        "feedback": feedback,
    }


def readable_status(stored: Any) -> dict[str, Any]:
    """The parts of a stored status this module reads back, dropped where their shape is wrong
    (a status written by hand or by something else must not stop the operator from writing its own)."""
    if not isinstance(stored, dict):
        return {}
    out = dict(stored)
    conds = stored.get("conditions")
    out["conditions"] = [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []
    feedback = stored.get("feedback")
    if not isinstance(feedback, dict):
        out.pop("feedback", None)
    elif not isinstance(feedback.get("lastDecision"), dict | None):
        out["feedback"] = {k: v for k, v in feedback.items() if k != "lastDecision"}
    return out


def strip_times(status: dict[str, Any]) -> dict[str, Any]:
    """The status without transition times, to decide whether a patch would change anything."""
    out = dict(status)
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status.get("conditions") or []]
    return out
