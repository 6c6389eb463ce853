"""Pure rendering of the pod template: engine and sidecar containers, volumes, security context."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from kvloop.operator import constants as C
from kvloop.operator import remote_store, routing
from kvloop.operator.limits import DEFAULT_ENGINE_RESOURCES, SIDECAR_RESOURCES
from kvloop.operator.spec import gpu_count

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
# Which Prometheus path scrapes a pod: its own ServiceMonitor, or else the cluster-wide PodMonitor
# (manifests/monitoring/podmonitor.yaml skips pods labelled "servicemonitor"), so no pod is scraped twice.
SCRAPE_LABEL = "kvloop.io/scraped-by"


def scrape_path(spec: dict[str, Any]) -> str:
    return "servicemonitor" if spec["observability"]["serviceMonitor"]["enabled"] else "podmonitor"


def images(spec: dict[str, Any], default_image: str) -> dict[str, str]:
    over = spec.get("images") or {}
    engine = over.get("engine") or default_image
    return {
        "engine": engine,
        "sidecar": over.get("sidecar") or engine,
        "fetcher": over.get("fetcher") or engine,
    }


def model_path(spec: dict[str, Any]) -> str:
    """Where the engine finds the model inside the pod ('embedded' means the copy in the image)."""
    model = spec["model"]
    if model["source"] == "pvc":
        return posixpath.join(C.MODEL_DIR, (model.get("path") or "").lstrip("/"))
    if model["source"] == "uri":
        name = posixpath.basename(model["uri"].split("?", 1)[0]) or "model"
        return posixpath.join(C.MODEL_DIR, name)
    return "embedded"


def _http_probe(path: str, port: str, **extra: Any) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, **extra}


def _volumes(spec: dict[str, Any], name: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(volumes, engine mounts, sidecar mounts)."""
    kv = spec["engine"]["kvCache"]
    volumes: list[dict[str, Any]] = [
        {"name": "control", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "config", "configMap": {"name": f"{name}-config"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    engine_mounts: list[dict[str, Any]] = [
        {"name": "control", "mountPath": C.CONTROL_DIR},
        {"name": "config", "mountPath": C.CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    sidecar_mounts: list[dict[str, Any]] = [
        {"name": "control", "mountPath": C.CONTROL_DIR},
        # A directory mount (not subPath) so the kubelet's ConfigMap updates reach the sidecar.
        {"name": "config", "mountPath": C.CONFIG_DIR, "readOnly": True},
    ]
    disk = kv["disk"]
    if disk["enabled"]:
        if disk["storage"] == "pvc":
            volumes.append({"name": "kv-disk", "persistentVolumeClaim": {"claimName": disk["claimName"]}})
        else:
            volumes.append({"name": "kv-disk", "emptyDir": {"sizeLimit": f"{disk['sizeGiB']}Gi"}})
        engine_mounts.append({"name": "kv-disk", "mountPath": C.KV_DISK_DIR})
    model = spec["model"]
    if model["source"] == "pvc":
        pvc = model["pvc"]
        volumes.append({"name": "model", "persistentVolumeClaim": {
            "claimName": pvc["claimName"], "readOnly": pvc.get("readOnly", True)}})
        engine_mounts.append({"name": "model", "mountPath": C.MODEL_DIR, "readOnly": True})
    elif model["source"] == "uri":
        volumes.append({"name": "model", "emptyDir": {"sizeLimit": model.get("cacheSize", "20Gi")}})
        engine_mounts.append({"name": "model", "mountPath": C.MODEL_DIR, "readOnly": True})
    if gpu_count(spec):
        # torch/NCCL use shared memory; the default 64 MiB /dev/shm is too small.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
        engine_mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, engine_mounts, sidecar_mounts


def render_pod_template(name: str, spec: dict[str, Any], engine_config: str, default_image: str) -> dict[str,
                                                                                                         Any]:
    imgs = images(spec, default_image)
    pull = (spec.get("images") or {}).get("pullPolicy", "IfNotPresent")
    volumes, engine_mounts, sidecar_mounts = _volumes(spec, name)
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    engine = {
        "name": "engine",
        "image": imgs["engine"],
        "imagePullPolicy": pull,
        "command": ["kvloop", "serve", "--host", "0.0.0.0", "--port", str(C.ENGINE_PORT),
                    "--config", f"{C.CONFIG_DIR}/engine.yaml"],
        "ports": [{"name": "http", "containerPort": C.ENGINE_PORT, "protocol": "TCP"},
                  *routing.engine_ports(spec)],
        "env": env + remote_store.engine_env(name, spec) + routing.engine_env(spec),
        "resources": spec.get("resources") or DEFAULT_ENGINE_RESOURCES,
        "startupProbe": _http_probe("/health", "http", periodSeconds=5, failureThreshold=120),
        "livenessProbe": _http_probe("/health", "http", periodSeconds=10, failureThreshold=3),
        "readinessProbe": _http_probe("/ready", "http", periodSeconds=5, failureThreshold=2),
        "volumeMounts": engine_mounts,
        "securityContext": dict(RESTRICTED_CONTAINER),
    }
    sidecar = {
        "name": "sidecar",
        "image": imgs["sidecar"],
        "imagePullPolicy": pull,
        "command": ["kvloop", "sidecar", "--config", f"{C.CONFIG_DIR}/sidecar.yaml",
                    "--control", C.CONTROL_PATH, "--port", str(C.SIDECAR_PORT)],
        "ports": [{"name": "feedback", "containerPort": C.SIDECAR_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": spec.get("sidecarResources") or SIDECAR_RESOURCES,
        "livenessProbe": _http_probe("/healthz", "feedback", periodSeconds=10),
        "readinessProbe": _http_probe("/healthz", "feedback", periodSeconds=10),
        "volumeMounts": sidecar_mounts,
        "securityContext": dict(RESTRICTED_CONTAINER),
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "securityContext": dict(RESTRICTED_POD),
        "containers": [engine, sidecar],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 60,
        "enableServiceLinks": False,
    }
    if spec["model"]["source"] == "uri":
        pod_spec["initContainers"] = [{
            "name": "fetch-model",
            "image": imgs["fetcher"],
            "imagePullPolicy": pull,
            "command": ["python", "-m", "kvloop.operator.fetch", "--uri", spec["model"]["uri"],
                        "--dest", model_path(spec)]
                       + (["--sha256", spec["model"]["sha256"]] if spec["model"].get("sha256") else []),
            "env": [{"name": "HOME", "value": "/tmp"}],
            "volumeMounts": [{"name": "model", "mountPath": C.MODEL_DIR},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": dict(RESTRICTED_CONTAINER),
        }]
    tolerations = list(spec.get("tolerations") or [])
    if gpu_count(spec) and not any(t.get("key") == "nvidia.com/gpu" for t in tolerations):
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    if tolerations:
        pod_spec["tolerations"] = tolerations
    for key in ("nodeSelector", "affinity", "priorityClassName", "imagePullSecrets", "runtimeClassName"):
        if spec.get(key):
            pod_spec[key] = spec[key]
    config_hash = hashlib.sha256(engine_config.encode()).hexdigest()[:16]
    return {
        "metadata": {
            "labels": {**C.common_labels(name), SCRAPE_LABEL: scrape_path(spec)},
            "annotations": {
                # Only engine settings restart pods; sidecar settings are reloaded in place.
                "kvloop.io/engine-config-hash": config_hash,
                "kubectl.kubernetes.io/default-container": "engine",
            },
        },
        "spec": pod_spec,
    }
