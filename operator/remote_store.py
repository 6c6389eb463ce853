"""spec.engine.kvCache.remote: the engine's remote KV tier, an existing Redis/Valkey store or one the operator
runs (managed: a Valkey StatefulSet with its PVC, Service, PodDisruptionBudget, config and password Secret).

Pure rendering and checks, no I/O. The engine gets the store's URL through engine.yaml and its password
through the environment variable KVLOOP_KV_REMOTE_PASSWORD (from a Secret), never through the file.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from kvloop.operator import constants as C
from kvloop.operator import engine_keys
from kvloop.operator.kube import CREATE_ONLY
from kvloop.operator.limits import quantity_or_none

URL_SCHEMES = ("redis://", "rediss://")
# Defaults inside a remote block (absent block: no remote tier). The CRD's schema reads them too.
REMOTE_DEFAULTS: dict[str, Any] = {"managed": False, "maxMemory": "1Gi"}
MIN_MAX_MEMORY = "16Mi"
PASSWORD_KEY = "password"


def remote_spec(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The remote block with its defaults, or None when the spec asks for no remote tier."""
    raw = spec["engine"]["kvCache"].get("remote")
    if raw is None:
        return None
    return {**copy.deepcopy(REMOTE_DEFAULTS), **raw}


def store_name(name: str) -> str:
    return f"{name}-kv"


def secret_name(name: str) -> str:
    return f"{name}-kv-password"


def store_url(name: str, remote: dict[str, Any]) -> str:
    if not remote["managed"]:
        return remote["url"]
    # the Service's short name: the engine pods run in the store's namespace
    return f"redis://{store_name(name)}:{C.VALKEY_PORT}/0"


def new_password() -> str:
    return secrets.token_urlsafe(32)


def password_ref(name: str, remote: dict[str, Any]) -> dict[str, str] | None:
    """The Secret key holding the store's password: the referenced one, else the generated one (managed)."""
    ref = remote.get("passwordSecretRef")
    if ref:
        return {"name": ref["name"], "key": ref["key"]}
    return {"name": secret_name(name), "key": PASSWORD_KEY} if remote["managed"] else None


# ---- checks: the CRD's CEL rules say the same (crd.py), for objects stored without them -----------------

WHERE = "engine.kvCache.remote"
# One message per rule: the CRD's CEL rule (crd.py remote_rules) and remote_problems say the same words.
ONE_OF = f"{WHERE} needs exactly one of url (an existing store) or managed: true"
SCHEME = f"{WHERE}.url must start with redis:// or rediss://"
NEEDS_STORAGE = f"{WHERE}.managed needs storage.size (the store's PersistentVolumeClaim)"
MANAGED_ONLY = f"{WHERE}.storage and image are only used with managed: true"
MAX_MEMORY = f"{WHERE}.maxMemory must be at least {MIN_MAX_MEMORY}"
STORAGE_FITS = f"{WHERE}.storage.size must be at least maxMemory (the store snapshots its memory there)"
SECRET_REF = f"{WHERE}.passwordSecretRef needs name and key"


def remote_problems(spec: dict[str, Any]) -> list[str]:
    remote = remote_spec(spec)
    if remote is None:
        return []
    out: list[str] = []
    has_url = bool(remote.get("url"))
    if has_url == bool(remote["managed"]):
        out.append(ONE_OF)
    if has_url and not str(remote["url"]).startswith(URL_SCHEMES):
        out.append(SCHEME)
    ref = remote.get("passwordSecretRef")
    if ref is not None and not (ref.get("name") and ref.get("key")):
        out.append(SECRET_REF)
    memory = quantity_or_none(remote["maxMemory"])
    if memory is None or memory < quantity_or_none(MIN_MAX_MEMORY):
        out.append(MAX_MEMORY)
    if remote["managed"]:
        size = quantity_or_none((remote.get("storage") or {}).get("size"))
        if size is None:
            out.append(NEEDS_STORAGE)
        elif memory is not None and size < memory:
            out.append(STORAGE_FITS)
    elif "storage" in remote or "image" in remote:
        out.append(MANAGED_ONLY)
    return out


# ---- rendering ----------------------------------------------------------------------------------------

def engine_settings(config: dict[str, Any], name: str, spec: dict[str, Any]) -> None:
    """The remote tier's engine.yaml keys (none without a remote block: the engine's default, no tier)."""
    remote = remote_spec(spec)
    if remote is None:
        return
    engine_keys.put(config, "--kv-remote-url", store_url(name, remote))
    if remote.get("timeoutMs") is not None:
        engine_keys.put(config, "--kv-remote-timeout-ms", remote["timeoutMs"])


def engine_env(name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    remote = remote_spec(spec)
    ref = password_ref(name, remote) if remote is not None else None
    if ref is None:
        return []
    return [{"name": C.KV_REMOTE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": ref}}]


def store_selector(name: str) -> dict[str, str]:
    """The store's pods: never the engine's selector (app.kubernetes.io/name kvloop), so neither the
    engine's Service nor its Deployment takes them."""
    return {"app.kubernetes.io/name": "valkey", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "kv-store"}


def _bytes(quantity: Any) -> int:
    value = quantity_or_none(quantity)
    assert value is not None  # remote_problems refused a malformed one
    return int(Fraction(value))


def valkey_conf(remote: dict[str, Any]) -> str:
    # allkeys-lru: the store is a cache of KV blocks, any of which may go (a miss, never a wrong token);
    # an RDB snapshot every 5 minutes (if 100 keys changed) brings a restarted store back warm.
    return "\n".join([
        f"port {C.VALKEY_PORT}", f"dir {C.VALKEY_DATA_DIR}",
        f"maxmemory {_bytes(remote['maxMemory'])}", "maxmemory-policy allkeys-lru",
        "save 300 100", "appendonly no", ""])


def render_managed_store(name: str, spec: dict[str, Any], meta: Callable[[str], dict[str, Any]],
                         password: Callable[[], str] = new_password) -> list[dict[str, Any]]:
    """The managed store's objects (empty unless remote.managed): config, password Secret (when none is
    referenced), headless Service, StatefulSet with its PVC template, PodDisruptionBudget."""
    remote = remote_spec(spec)
    if remote is None or not remote["managed"]:
        return []
    store, ref = store_name(name), password_ref(name, remote)
    assert ref is not None
    out: list[dict[str, Any]] = []
    conf = valkey_conf(remote)
    out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{store}-config"),
                "data": {"valkey.conf": conf}})
    if not remote.get("passwordSecretRef"):
        secret_meta = meta(ref["name"])
        secret_meta["annotations"] = {CREATE_ONLY: "true"}
        out.append({"apiVersion": "v1", "kind": "Secret", "metadata": secret_meta, "type": "Opaque",
                    "stringData": {PASSWORD_KEY: password()}})
    selector = store_selector(name)
    out.append({"apiVersion": "v1", "kind": "Service", "metadata": meta(store),
                "spec": {"clusterIP": "None", "selector": selector,
                         "ports": [{"name": "valkey", "port": C.VALKEY_PORT, "targetPort": "valkey",
                                    "protocol": "TCP"}]}})
    storage = remote["storage"]
    claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": str(storage["size"])}}}
    if storage.get("storageClassName"):
        claim["storageClassName"] = storage["storageClassName"]
    memory_mib = -(-_bytes(remote["maxMemory"]) // 2**20)
    # Valkey's own overhead beside maxmemory (buffers, fork for the snapshot): a quarter more, 64 MiB floor.
    limit_mib = memory_mib + max(64, memory_mib // 4)
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                  "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {
        "name": "valkey",
        "image": remote.get("image") or C.VALKEY_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        # Kubernetes expands $(VALKEY_PASSWORD) from the env below; valkey.conf has no way to read it.
        "command": ["valkey-server", "/etc/valkey/valkey.conf", "--requirepass", "$(VALKEY_PASSWORD)"],
        "env": [{"name": "VALKEY_PASSWORD", "valueFrom": {"secretKeyRef": ref}}],
        "ports": [{"name": "valkey", "containerPort": C.VALKEY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "valkey"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "valkey"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": f"{limit_mib}Mi"},
                      "limits": {"memory": f"{limit_mib}Mi"}},
        "volumeMounts": [{"name": "data", "mountPath": C.VALKEY_DATA_DIR},
                         {"name": "config", "mountPath": "/etc/valkey", "readOnly": True}],
        "securityContext": restricted,
    }
    out.append({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(store),
        "spec": {
            "serviceName": store, "replicas": 1, "selector": {"matchLabels": selector},
            # a cache: its volume goes with the InferenceService, and stays while it exists
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
            "template": {
                "metadata": {"labels": dict(selector), "annotations": {
                    "kvloop.io/config-hash": hashlib.sha256(conf.encode()).hexdigest()[:16]}},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999,
                                        "fsGroup": 999, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": f"{store}-config"}}],
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 30,
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}],
        },
    })
    # One store pod: a drain may move it (the engines see misses meanwhile, never errors); the budget keeps
    # voluntary disruptions to that one pod.
    out.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(store),
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}}})
    return out
