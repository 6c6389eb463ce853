"""Pure rendering of an InferenceService's children: spec in, manifests out. No I/O here.

`render_children` returns every object the operator keeps in the cluster for one custom resource,
each with the owner reference that lets Kubernetes garbage-collect it with its owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from kvloop.operator import constants as C
from kvloop.operator import engine_keys, remote_store, routing, step_budget
from kvloop.operator.render_pod import model_path, render_pod_template
from kvloop.operator.spec import gpu_count, with_defaults

# Every kind render_children can return, in the order it renders them; pruning lists these.
OWNED_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("v1", "ConfigMap"), ("apps/v1", "Deployment"),
    ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("inference.networking.k8s.io/v1", "InferencePool"), ("v1", "Secret"), ("apps/v1", "StatefulSet"),
)


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def engine_config(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    config = _engine_config(name, spec)
    if spec["engine"].get("speculation") is not None:
        engine_keys.put(config, "--speculation", spec["engine"]["speculation"])
    remote_store.engine_settings(config, name, spec)
    routing.engine_settings(config, spec)
    return config


def _engine_config(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    eng, kv, slo = spec["engine"], spec["engine"]["kvCache"], spec["slo"]
    return {
        "model": {"source": spec["model"]["source"], "path": model_path(spec),
                  "served_name": spec["model"].get("name") or C.EMBEDDED_MODEL_NAME,
                  **({"format": spec["model"]["format"]} if spec["model"].get("format") else {})},
        "device": eng["device"], "dtype": eng["dtype"],
        "block_size": eng["blockSize"], "max_model_len": eng["maxModelLen"],
        "scheduler": {"mode": eng["scheduler"]["mode"], "max_num_seqs": eng["scheduler"]["maxNumSeqs"],
                      "max_num_batched_tokens": eng["scheduler"]["maxNumBatchedTokens"],
                      "chunked_prefill": eng["scheduler"]["chunkedPrefill"],
                      "tpot_target_ms": eng["scheduler"].get("tpotTargetMs")},
        "kv_cache": {
            "device_pool_mib": kv["devicePoolMiB"], "host_pool_mib": kv["hostPoolMiB"],
            "disk_dir": C.KV_DISK_DIR if kv["disk"]["enabled"] else None,
            "disk_size_gib": kv["disk"]["sizeGiB"] if kv["disk"]["enabled"] else 0,
            "admit_min_requests": kv["admitMinRequests"],
            "host_admit_min_requests": kv["hostAdmitMinRequests"],
            "min_prefix_tokens": kv["minPrefixTokens"], "retention_watermark": kv["retentionWatermark"],
        },
        "slo": {"ttft_s": slo["ttftSeconds"],
                "ttft_per_1k_prompt_tokens_s": slo["ttftPerThousandPromptTokensSeconds"],
                "tpot_s": slo["tpotSeconds"]},
        "control": {"path": C.CONTROL_PATH, "targets_stale_after_s": spec["feedback"]["staleAfterSeconds"]},
        "log_level": spec["observability"]["logLevel"],
        "instance": name,
    }


def sidecar_config(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    fb = spec["feedback"]
    return {
        "mode": fb["mode"], "period_s": fb["intervalSeconds"], "stale_after_s": fb["staleAfterSeconds"],
        # no initial values: the coordinator starts from the engine's (engine.yaml's cap and watermark, read
        # from its snapshot), as `kvloop sidecar` does beside `kvloop serve`
        "batch_cap": {"min": fb["batchCap"]["min"], "max": fb["batchCap"]["max"],
                      "max_step": fb["batchCap"]["maxStep"]},
        "watermark": {"min": fb["watermark"]["min"], "max": fb["watermark"]["max"],
                      "max_step": fb["watermark"]["maxStep"]},
        "step_token_budget": step_budget.resolved(spec),
        "event_path": {"enabled": fb["eventPath"]["enabled"]},
        "targets": {"ttft_p99_s": fb["targets"].get("ttftP99Seconds"),
                    "tpot_p50_s": fb["targets"].get("tpotP50Seconds"),
                    "max_queue_depth": fb["targets"].get("maxQueueDepth")},
        "control": {"path": C.CONTROL_PATH},
        "engine_metrics_url": f"http://127.0.0.1:{C.ENGINE_PORT}/metrics",
        "annotation": {"enabled": True, "key": C.FEEDBACK_ANNOTATION},
        "log_level": spec["observability"]["logLevel"],
        "instance": name,
    }


def _dump(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=True)


def render_children(name: str, namespace: str, uid: str, raw_spec: dict[str, Any],
                    default_image: str = C.DEFAULT_IMAGE,
                    new_password: Callable[[], str] = remote_store.new_password) -> list[dict[str, Any]]:
    """Every child; `new_password` makes the managed store's password when the operator generates it (the
    Secret is created once and then left alone, kube.apply)."""
    spec = with_defaults(raw_spec)
    owner = [owner_reference(name, uid)]
    labels = C.common_labels(name)

    def meta(child: str) -> dict[str, Any]:
        return {"name": child, "namespace": namespace, "labels": dict(labels), "ownerReferences": owner}

    engine_yaml = _dump(engine_config(name, spec))
    children: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name),
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(name),
         # The sidecar writes its feedback as an annotation on its own pod (get, then patch).
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(name),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{name}-config"),
         "data": {"engine.yaml": engine_yaml, "sidecar.yaml": _dump(sidecar_config(name, spec))}},
    ]
    gpus = gpu_count(spec)
    strategy = ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}} if gpus
                else {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    children.append({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name),
        "spec": {
            "replicas": spec["replicas"],
            "selector": {"matchLabels": C.selector_labels(name)},
            "strategy": strategy,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 900,
            "template": render_pod_template(name, spec, engine_yaml, default_image),
        },
    })
    svc = spec["service"]
    children.append({
        "apiVersion": "v1", "kind": "Service", "metadata": meta(name),
        "spec": {"type": svc["type"], "selector": C.selector_labels(name),
                 "ports": [{"name": "http", "port": svc["port"], "targetPort": "http", "protocol": "TCP"},
                           {"name": "feedback", "port": C.SIDECAR_PORT, "targetPort": "feedback",
                            "protocol": "TCP"}]},
    })
    if spec["replicas"] > 1:
        children.append({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(name),
            "spec": {"maxUnavailable": spec["podDisruptionBudget"]["maxUnavailable"],
                     "selector": {"matchLabels": C.selector_labels(name)}},
        })
    sm = spec["observability"]["serviceMonitor"]
    if sm["enabled"]:
        children.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {**meta(name), "labels": {**labels, **(sm.get("labels") or {})}},
            "spec": {"selector": {"matchLabels": C.selector_labels(name)},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": sm["interval"]},
                                   {"port": "feedback", "path": "/metrics", "interval": sm["interval"]}]},
        })
    children += routing.render_routing(name, namespace, spec, meta)
    children += remote_store.render_managed_store(name, spec, meta, new_password)
    return children
