"""spec.routing: a plain Service (mode none), or mode InferencePool: the Gateway API Inference Extension's
InferencePool over the engine pods and, unless spec.routing.inferencePool.endpointPicker names an existing
one, its endpoint picker (EPP): a Deployment with its config, Service and RBAC. Pure rendering, no I/O.

Formats, from the projects' own docs and code (read through the search tool; cited, not copied):
- InferencePool `inference.networking.k8s.io/v1` (GA in gateway-api-inference-extension v1.0): spec.selector
  .matchLabels, spec.targetPorts[].number, spec.endpointPickerRef {name, port.number, failureMode}.
- EndpointPickerConfig `inference.networking.x-k8s.io/v1alpha1` (the EPP's --config-file): `plugins` (type,
  optional parameters) and `schedulingProfiles` (pluginRef, weight), e.g. the chart default-plugins.yaml of
  gateway-api-inference-extension and llm-d's guides/precise-prefix-cache-aware/gaie-kv-events values.
- EPP flags (cmd/epp options): --pool-name, --pool-namespace, --config-file, --grpc-port (9002),
  --grpc-health-port (9003), --metrics-port (9090), --metrics-endpoint-auth; the model-server metrics it
  scrapes by default: vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
  vllm:lora_requests_info, vllm:cache_config_info.
- Precise prefix scoring (llm-d-inference-scheduler's precise-prefix-cache-scorer, llm-d docs "KV-Cache
  Indexer" configuration): kvEventsConfig {topicFilter "kv@", discoverPods, podDiscoveryConfig
  {podLabelSelector, podNamespace, socketPort 5557}}: the picker connects to a ZeroMQ PUB socket on every
  pod and indexes the blocks each one reports; tokenProcessorConfig.blockSize must be the engine's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import yaml

from kvloop.operator import constants as C
from kvloop.operator import engine_keys

# The model-server metrics the picker scrapes from each pod's /metrics by default (its flags
# --total-queued-requests-metric, --total-running-requests-metric, --kv-cache-usage-percentage-metric,
# --lora-info-metric, --cache-info-metric); tests/operator/test_remote_routing.py holds the engine to them.
EPP_SCRAPED_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                       "vllm:lora_requests_info", "vllm:cache_config_info")
MODES = ("none", "InferencePool")
PREFIX_SCORING = ("estimated", "precise")
CONFIG_FILE = "/etc/epp/config.yaml"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"


def pool_enabled(spec: dict[str, Any]) -> bool:
    return spec["routing"]["mode"] == "InferencePool"


def renders_picker(spec: dict[str, Any]) -> bool:
    external = spec["routing"]["inferencePool"].get("endpointPicker") or {}
    return pool_enabled(spec) and not external.get("name")


def precise(spec: dict[str, Any]) -> bool:
    return renders_picker(spec) and spec["routing"]["inferencePool"]["prefixScoring"] == "precise"


def picker_name(name: str) -> str:
    return f"{name}-epp"


def picker_selector(name: str) -> dict[str, str]:
    """The picker's pods: never the engine's selector, so the pool and the engine Service skip them."""
    return {"app.kubernetes.io/name": "kvloop-epp", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "endpoint-picker"}


# llm-d's picker recomputes vLLM's block hashes from the tokens (sha256 over CBOR, 64 bits, from a seed) and
# matches them against the events: the engine publishes the same hashes from the same seed.
EVENT_HASH = "vllm_sha256_cbor_64bit"
HASH_SEED = ""
# llm-d decodes each event as vLLM's array_like struct (an array led by its tag), not a tagged map
EVENT_ENCODING = "array"


def served_model(spec: dict[str, Any]) -> str:
    return spec["model"].get("name") or C.EMBEDDED_MODEL_NAME


def engine_settings(config: dict[str, Any], spec: dict[str, Any]) -> None:
    """A precise picker reads the pods' KV events: each engine publishes them on its own port, with the
    topic llm-d reads the pod and the model from (kv@<pod-ip>:<port>@<model>; ${POD_IP} from the pod's
    environment, which the engine must expand: the settings file is the same for every pod)."""
    if precise(spec):
        engine_keys.put(config, "--kv-events-endpoint", f"tcp://*:{C.KV_EVENTS_PORT}")
        engine_keys.put(config, "--kv-events-topic", f"kv@${{POD_IP}}:{C.ENGINE_PORT}@{served_model(spec)}")
        engine_keys.put(config, "--kv-events-hash", EVENT_HASH)
        engine_keys.put(config, "--kv-events-hash-seed", HASH_SEED)
        engine_keys.put(config, "--kv-events-encoding", EVENT_ENCODING)


def engine_env(spec: dict[str, Any]) -> list[dict[str, Any]]:
    if not precise(spec):
        return []
    return [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def engine_ports(spec: dict[str, Any]) -> list[dict[str, Any]]:
    if not precise(spec):
        return []
    return [{"name": "kv-events", "containerPort": C.KV_EVENTS_PORT, "protocol": "TCP"}]


def picker_config(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """EndpointPickerConfig: prefix-cache affinity first, then queue length and KV-cache use (a prefix hit
    saves a whole prefill; the load signals break ties and keep hot pods from drowning)."""
    if precise(spec):
        selector = ",".join(f"{k}={v}" for k, v in C.selector_labels(name).items())
        prefix = {"type": "precise-prefix-cache-scorer", "parameters": {
            "tokenProcessorConfig": {"blockSize": spec["engine"]["blockSize"], "hashSeed": HASH_SEED},
            "indexerConfig": {"tokenizersPoolConfig": {"modelName": served_model(spec)}},
            "kvEventsConfig": {"topicFilter": "kv@", "discoverPods": True, "podDiscoveryConfig": {
                "podLabelSelector": selector, "podNamespace": namespace, "socketPort": C.KV_EVENTS_PORT}}}}
    else:
        # the upstream scorer hashes the prompt's text in blocks of hashBlockSize characters and remembers
        # where it sent each: its defaults (gateway-api-inference-extension plugins/scheduling prefix)
        prefix = {"type": "prefix-cache-scorer", "parameters": {
            "hashBlockSize": 64, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250}}
    return {
        "apiVersion": EPP_CONFIG_API, "kind": "EndpointPickerConfig",
        "plugins": [{"type": "single-profile-handler"}, prefix, {"type": "queue-scorer"},
                    {"type": "kv-cache-utilization-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": prefix["type"], "weight": 3}, {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2}, {"pluginRef": "max-score-picker"}]}],
    }


def render_routing(name: str, namespace: str, spec: dict[str, Any],
                   meta: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The InferencePool and, unless an existing picker is named, the picker's objects."""
    if not pool_enabled(spec):
        return []
    pool = spec["routing"]["inferencePool"]
    external = pool.get("endpointPicker") or {}
    epp = picker_name(name)
    ref = {"name": external.get("name") or epp, "port": {"number": external.get("port", C.EPP_GRPC_PORT)},
           "failureMode": external.get("failureMode", "FailOpen")}
    out: list[dict[str, Any]] = [{
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": meta(name),
        "spec": {"selector": {"matchLabels": C.selector_labels(name)},
                 "targetPorts": [{"number": C.ENGINE_PORT}], "endpointPickerRef": ref}}]
    if not renders_picker(spec):
        return out
    selector = picker_selector(name)
    read = ["get", "list", "watch"]
    config_text = yaml.safe_dump(picker_config(name, namespace, spec), sort_keys=False)
    out += [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(epp),
         "automountServiceAccountToken": True},
        # The picker watches its pool, the pool's pods and the objectives that name the pool.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(epp), "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": read},
            {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives"],
             "verbs": read}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(epp),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp},
         "subjects": [{"kind": "ServiceAccount", "name": epp, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{epp}-config"),
         "data": {"config.yaml": config_text}},
    ]
    image = pool.get("pickerImage") or (C.EPP_PRECISE_IMAGE if precise(spec) else C.EPP_IMAGE)
    grpc_probe = {"grpc": {"port": C.EPP_HEALTH_PORT, "service": "inference-extension"}}
    container = {
        "name": "epp", "image": image, "imagePullPolicy": "IfNotPresent",
        "args": ["--pool-name", name, "--pool-namespace", namespace, "--config-file", CONFIG_FILE,
                 "--grpc-port", str(C.EPP_GRPC_PORT), "--grpc-health-port", str(C.EPP_HEALTH_PORT),
                 "--metrics-port", str(C.EPP_METRICS_PORT),
                 # metrics auth needs cluster-wide tokenreviews; the operator grants namespaced roles only
                 "--metrics-endpoint-auth=false"],
        "ports": [{"name": "grpc", "containerPort": C.EPP_GRPC_PORT, "protocol": "TCP"},
                  {"name": "grpc-health", "containerPort": C.EPP_HEALTH_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": C.EPP_METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": {**grpc_probe, "periodSeconds": 10},
        "readinessProbe": {**grpc_probe, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/epp", "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    out.append({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(epp),
        "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": dict(selector), "annotations": {
                     "kvloop.io/config-hash": hashlib.sha256(config_text.encode()).hexdigest()[:16]}},
                     "spec": {
                     "serviceAccountName": epp, "containers": [container],
                     "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                     "volumes": [{"name": "config", "configMap": {"name": f"{epp}-config"}}],
                     "terminationGracePeriodSeconds": 30}}}})
    out.append({
        "apiVersion": "v1", "kind": "Service", "metadata": meta(epp),
        "spec": {"selector": selector, "ports": [
            {"name": "grpc-ext-proc", "port": C.EPP_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
             "appProtocol": "http2"},
            {"name": "metrics", "port": C.EPP_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}]}})
    return out
