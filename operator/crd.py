"""The InferenceService CustomResourceDefinition, built here and written to YAML by

    python -m kvloop.operator.crd > manifests/base/crd.yaml   (and charts/kvloop/crds/)

Tests check that both files equal this output, validate custom resources against the schema
(converted to JSON Schema) and evaluate its CEL rules. Every default in the schema is read from
spec.DEFAULTS (`_d`), the one place the operator writes them.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from kvloop.engine.core.policy import policy_names
from kvloop.operator import constants as C
from kvloop.operator import limits as L
from kvloop.operator import remote_store as RS
from kvloop.operator import step_budget as SB
from kvloop.operator.routing import MODES, PREFIX_SCORING
from kvloop.operator.spec import DEFAULTS, SLO_BOUNDS, SPECULATION, SPECULATION_MODES


def _d(path: str) -> Any:
    """The default at a dotted path of spec.DEFAULTS."""
    value: Any = DEFAULTS
    for key in path.split("."):
        value = value[key]
    return value


def _p(kind: str, desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": kind, "description": desc, **kw}


def i(desc: str, lo: int | None = None, hi: int | None = None, default: int | None = None) -> dict[str, Any]:
    out = _p("integer", desc)
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    if default is not None:
        out["default"] = default
    return out


def n(desc: str, lo: float, hi: float, default: float | None = None,
      exclusive_max: bool = False) -> dict[str, Any]:
    out = _p("number", desc, minimum=lo, maximum=hi)
    if exclusive_max:
        out["exclusiveMaximum"] = True
    if default is not None:
        out["default"] = default
    return out


def s(desc: str, enum: list[str] | None = None, default: str | None = None, **kw: Any) -> dict[str, Any]:
    out = _p("string", desc, **kw)
    if enum:
        out["enum"] = enum
    if default is not None:
        out["default"] = default
    return out


def b(desc: str, default: bool | None = None) -> dict[str, Any]:
    out = _p("boolean", desc)
    if default is not None:
        out["default"] = default
    return out


def o(desc: str, props: dict[str, Any], *, default: Any = None, required: list[str] | None = None,
      rules: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    out = _p("object", desc, properties=props)
    if default is not None:
        out["default"] = default
    if required:
        out["required"] = required
    if rules:
        out["x-kubernetes-validations"] = [{"rule": r, "message": m} for r, m in rules]
    return out


QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
            "pattern": L.QUANTITY_PATTERN, "maxLength": 64}  # bounds the CEL cost estimate


def _q(expr: str) -> str:
    """CEL: a quantity from an int-or-string value (Kubernetes' quantity library takes strings)."""
    return f"quantity(string({expr}))"


def _present(obj: str, part: str, key: str) -> str:
    return f"has({obj}.{part}) && '{key}' in {obj}.{part}"


def resource_rules(field: str, floors: dict[str, str]) -> list[tuple[str, str]]:
    """CEL for limits.resource_problems: the same table (keys, floors) and the same messages."""
    rules: list[tuple[str, str]] = []
    for part in ("requests", "limits"):
        for key in L.CHECKED_RESOURCES:
            rules.append((f"!({_present('self', part, key)}) || {_q(f'self.{part}[{key!r}]')}.sign() >= 0",
                          L.negative_message(field, part, key)))
    for key in L.CHECKED_RESOURCES:
        rules.append((f"!({_present('self', 'requests', key)} && {_present('self', 'limits', key)}) || "
                      f"{_q(f'self.requests[{key!r}]')}.compareTo({_q(f'self.limits[{key!r}]')}) <= 0",
                      L.above_limit_message(field, key)))
    for key, floor in floors.items():
        rules.append((f"!({_present('self', 'limits', key)}) || "
                      f"{_q(f'self.limits[{key!r}]')}.compareTo(quantity({floor!r})) >= 0",
                      L.floor_message(field, key, floor)))
    return rules


def memory_rules() -> list[tuple[str, str]]:
    """CEL for limits.memory_problems, on the spec: RAM pools + headroom within the memory limit."""
    kv = "self.engine.kvCache"
    gpus, memory = _q("self.resources.limits['nvidia.com/gpu']"), _q("self.resources.limits['memory']")
    gpu_limit = _present("self.resources", "limits", "nvidia.com/gpu")
    gpu = f"has(self.resources) && {gpu_limit} && {gpus}.sign() > 0"
    headroom = L.RUNTIME_HEADROOM_MIB
    need = f"quantity(string({kv}.hostPoolMiB + ({gpu} ? 0 : {kv}.devicePoolMiB) + {headroom}) + 'Mi')"
    default_need = f"quantity(string({kv}.hostPoolMiB + {kv}.devicePoolMiB + {headroom}) + 'Mi')"
    default_limit = L.DEFAULT_ENGINE_RESOURCES["limits"]["memory"]
    return [
        (f"!(has(self.resources) && {_present('self.resources', 'limits', 'memory')}) || "
         f"{memory}.compareTo({need}) >= 0",
         L.pools_message(default=False)),
        (f"has(self.resources) || quantity('{default_limit}').compareTo({default_need}) >= 0",
         L.pools_message(default=True)),
    ]


def resources(field: str, desc: str, floors: dict[str, str] | None = None) -> dict[str, Any]:
    qmap = {"type": "object", "additionalProperties": QUANTITY, "maxProperties": 16}
    return o(desc, {"requests": {**qmap, "description": "Minimum resources (cpu, memory, nvidia.com/gpu)."},
                    "limits": {**qmap, "description": "Maximum resources; GPUs must be set here."}},
             rules=[("!has(self.requests) || !('nvidia.com/gpu' in self.requests) || "
                     "(has(self.limits) && 'nvidia.com/gpu' in self.limits && "
                     "string(self.requests['nvidia.com/gpu']) == string(self.limits['nvidia.com/gpu']))",
                     "nvidia.com/gpu requests must equal limits"), *resource_rules(field, floors or {})])


def _describe(res: dict[str, Any]) -> str:
    """'requests cpu 1, memory 2Gi; limits memory 4Gi' for a resources block."""
    return "; ".join(f"{part} " + ", ".join(f"{k} {v}" for k, v in values.items())
                     for part, values in res.items())


def image(key: str, desc: str) -> dict[str, Any]:
    out = s(desc, minLength=1, maxLength=512)
    out["x-kubernetes-validations"] = [{"rule": f"self.matches('{L.IMAGE_REFERENCE}')",
                                        "message": L.image_message(key)}]
    return out


def remote_schema() -> dict[str, Any]:
    """spec.engine.kvCache.remote, with RS's rules as CEL (remote_problems: the same, for stored objects)."""
    managed = "(has(self.managed) && self.managed)"
    size, memory = _q("self.storage.size"), _q("self.maxMemory")
    return o(
        "A remote KV tier below host and disk, shared by every pod: an existing Redis or Valkey store (url, "
        "with passwordSecretRef when it needs a password), or managed: true for a Valkey StatefulSet the "
        "operator runs (with a PersistentVolumeClaim, a PodDisruptionBudget and a generated password "
        "unless passwordSecretRef names one). Unset: no remote tier.", {
            "url": s("An existing store: redis://host:port/db or rediss:// for TLS. No password in it.",
                     minLength=9, maxLength=2048),
            "passwordSecretRef": o("The Secret key holding the store's password (the engine reads it from "
                                   "KVLOOP_KV_REMOTE_PASSWORD).", {
                                       "name": s("Secret name.", minLength=1, maxLength=253),
                                       "key": s("Key in the Secret.", minLength=1, maxLength=253)},
                                   required=["name", "key"]),
            "timeoutMs": i("Timeout of each store call, ms (unset: the engine's --kv-remote-timeout-ms "
                           "default); a slow store turns into misses.", 1, 60000),
            "managed": b("Run a Valkey store for this InferenceService.", RS.REMOTE_DEFAULTS["managed"]),
            "maxMemory": {**QUANTITY, "default": RS.REMOTE_DEFAULTS["maxMemory"],
                          "description": "The managed store's memory for blocks (Valkey maxmemory; the "
                                         "least recently used blocks go first beyond it)."},
            "storage": o("The managed store's volume (a PersistentVolumeClaim per store pod).", {
                "size": {**QUANTITY, "description": "Size of the claim (at least maxMemory)."},
                "storageClassName": s("Storage class (unset: the cluster's default).", maxLength=253)}),
            "image": image("kvCache.remote.image", f"Valkey image (default {C.VALKEY_IMAGE})."),
        },
        rules=[
            (f"has(self.url) != {managed}", RS.ONE_OF),
            ("!has(self.url) || self.url.matches('^rediss?://')", RS.SCHEME),
            (f"!{managed} || (has(self.storage) && has(self.storage.size))", RS.NEEDS_STORAGE),
            (f"{managed} || (!has(self.storage) && !has(self.image))", RS.MANAGED_ONLY),
            (f"!has(self.maxMemory) || {memory}.compareTo(quantity('{RS.MIN_MAX_MEMORY}')) >= 0",
             RS.MAX_MEMORY),
            (f"!(has(self.storage) && has(self.storage.size) && has(self.maxMemory)) || "
             f"{size}.compareTo({memory}) >= 0", RS.STORAGE_FITS),
        ])


def routing_schema() -> dict[str, Any]:
    return o("How requests reach the pods.", {
        "mode": s("none: a plain Service spreads requests over the pods. InferencePool: the Gateway API "
                  "Inference Extension's InferencePool over the pods and an endpoint picker that sends each "
                  "request to the pod holding most of its prefix, weighed against queue length and KV-cache "
                  "use (for more than one replica; route to it with an HTTPRoute from your Gateway).",
                  list(MODES), _d("routing.mode")),
        "inferencePool": o("The InferencePool's endpoint picker.", {
            "prefixScoring": s("estimated: the upstream picker scores prefixes from its own routing history; "
                               "precise: llm-d's scheduler scores them from the KV events each pod publishes "
                               "(every pod then publishes them on port 5557).", list(PREFIX_SCORING),
                               _d("routing.inferencePool.prefixScoring")),
            "pickerImage": image("routing.inferencePool.pickerImage",
                                 f"Endpoint picker image (default {C.EPP_IMAGE}, or {C.EPP_PRECISE_IMAGE} "
                                 "for precise)."),
            "endpointPicker": o("An existing endpoint picker Service to use instead of rendering one.", {
                "name": s("Service name of the endpoint picker.", minLength=1, maxLength=253),
                "port": i("Its gRPC port.", 1, 65535, C.EPP_GRPC_PORT),
                "failureMode": s("What the gateway does when the picker is down.",
                                 ["FailOpen", "FailClose"], "FailOpen")}, required=["name"]),
        }, default={}),
    }, default={})


def spec_schema() -> dict[str, Any]:
    model = o("Which model to serve.", {
        "source": s("embedded: the SmolLM2-135M-Instruct GGUF inside the image; pvc: a path on a "
                    "PersistentVolumeClaim; uri: a file fetched by an init container.",
                    ["embedded", "pvc", "uri"], _d("model.source")),
        "name": s("Model name served on /v1/models.", default=_d("model.name"), maxLength=128,
                  pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"),
        "format": s("Weights format; detected from the path when unset.", ["gguf", "hf"]),
        "path": s("For source pvc: file or Hugging Face directory inside the claim.", maxLength=1024),
        "pvc": o("For source pvc: the claim holding the model.", {
            "claimName": s("PersistentVolumeClaim name.", minLength=1, maxLength=253),
            "readOnly": b("Mount the claim read-only.", True)}, required=["claimName"]),
        "uri": s("For source uri: http(s) or file URI of a GGUF file.", maxLength=2048,
                 pattern=r"^(https?|file)://.+"),
        "sha256": s("Expected SHA-256 of the fetched file.", pattern=r"^[a-f0-9]{64}$"),
        "cacheSize": {**QUANTITY, "description": "Size limit of the emptyDir the fetched model lives in."},
    }, default={}, rules=[
        ("self.source != 'pvc' || (has(self.pvc) && has(self.path))",
         "source pvc needs pvc.claimName and path"),
        ("self.source != 'uri' || has(self.uri)", "source uri needs uri"),
        ("self.source == 'pvc' || !has(self.pvc)", "pvc is only used with source pvc"),
        ("self.source == 'uri' || !has(self.uri)", "uri is only used with source uri"),
    ])
    disk = o("Disk tier: a directory of KV block files.", {
        "enabled": b("Keep a disk tier.", _d("engine.kvCache.disk.enabled")),
        "storage": s("emptyDir (node-local, lost with the pod) or pvc (an existing claim).",
                     ["emptyDir", "pvc"], _d("engine.kvCache.disk.storage")),
        "sizeGiB": i("Size limit of the tier in GiB.", 1, 10000, _d("engine.kvCache.disk.sizeGiB")),
        "claimName": s("For storage pvc: the claim to use.", maxLength=253),
    }, default={},
    rules=[("self.storage != 'pvc' || has(self.claimName)", "disk storage pvc needs claimName")])
    kv = o("Paged, tiered KV cache.", {
        "remote": remote_schema(),
        "devicePoolMiB": i("Device pool (GPU memory; RAM on CPU) in MiB (default: the engine's 65,536 tokens "
                           "of the embedded model's bf16 KV).", 16, 1048576,
                           _d("engine.kvCache.devicePoolMiB")),
        "hostPoolMiB": i("Host (CPU memory) pool in MiB; 0 disables the tier.", 0, 1048576,
                         _d("engine.kvCache.hostPoolMiB")),
        "disk": disk,
        "admitMinRequests": i("Distinct requests a block needs to earn its place in the device pool (under "
                              "pressure, blocks that have not earned it are evicted first).", 1, 64,
                              _d("engine.kvCache.admitMinRequests")),
        "hostAdmitMinRequests": i("Distinct requests a block needs to keep its place in the host pool under "
                                  "pressure (blocks evicted from the device are copied there lazily; while "
                                  "it has room, all of them; when full, blocks below this displace only "
                                  "each other and leave first).", 1, 64,
                                  _d("engine.kvCache.hostAdmitMinRequests")),
        "minPrefixTokens": i("Shorter prefix matches are treated as misses.", 0, 65536,
                             _d("engine.kvCache.minPrefixTokens")),
        "retentionWatermark": n("Share of the device pool kept for cached blocks: the engine's configured "
                                "value, where the coordinator starts and what stale targets fall back to.",
                                0.0, 1.0, _d("engine.kvCache.retentionWatermark"), True),
    }, default={}, rules=[("self.hostAdmitMinRequests <= self.admitMinRequests",
                           "hostAdmitMinRequests must not exceed admitMinRequests"),
                          ("self.retentionWatermark < 1.0", "retentionWatermark must be below 1")])
    engine = o("Engine settings (restart the pods when changed).", {
        "device": s("Where the model runs (auto: the GPU when there is one).", ["auto", "cpu", "cuda"],
                    _d("engine.device")),
        "dtype": s("Compute dtype.", ["auto", "float32", "bfloat16", "float16"], _d("engine.dtype")),
        "blockSize": {**i("Tokens per KV block.", default=_d("engine.blockSize")),
                      "enum": [8, 16, 32, 64, 128]},
        "maxModelLen": i("Maximum context length in tokens (the model's own, if smaller).", 128, 1048576,
                         _d("engine.maxModelLen")),
        "scheduler": o("Continuous batching.", {
            "mode": s("Scheduler mode.", list(policy_names()), _d("engine.scheduler.mode")),
            "maxNumSeqs": i("Batch cap (running requests): the engine's configured value, where it starts "
                            "and what stale targets fall back to; the coordinator moves the live cap within "
                            "feedback.batchCap.", 1, 4096, _d("engine.scheduler.maxNumSeqs")),
            "maxNumBatchedTokens": i("Token budget per step: where the engine starts and the ceiling of the "
                                     "live budget the coordinator moves within feedback.stepTokenBudget.",
                                     SB.FLOOR, 1048576, _d("engine.scheduler.maxNumBatchedTokens")),
            "chunkedPrefill": b("Split long prompts into chunks.", _d("engine.scheduler.chunkedPrefill")),
            "tpotTargetMs": n("Time per output token (ms) the engine holds: while its recent decode steps "
                              "are slower, waiting requests wait (running ones are never preempted for it). "
                              "Unset: no target, the batch cap alone bounds the running requests.", 1.0,
                              600000.0),
        }, default={}),
        "speculation": s("Speculative decoding: ngram proposes tokens from the request's own prompt and "
                         "output (prompt lookup) and verifies them in the same step, exactly; auto turns it "
                         "on where the cost model says it pays; off: none (default: kvloop serve's).",
                         list(SPECULATION_MODES), SPECULATION.value if SPECULATION is not None else None),
        "kvCache": kv,
    }, default={})
    bound_cap = o("Batch cap bounds and step.", {
        "min": i("Lowest batch cap.", 1, 4096, _d("feedback.batchCap.min")),
        "max": i("Highest batch cap.", 1, 4096, _d("feedback.batchCap.max")),
        "maxStep": i("Largest change per period.", 1, 4096, _d("feedback.batchCap.maxStep"))},
        default={}, rules=[("self.min <= self.max", "batchCap.min must be <= batchCap.max"),
                           ("self.maxStep <= self.max", "batchCap.maxStep must be <= batchCap.max")])
    bound_w = o("Retention watermark bounds and step.", {
        "min": n("Lowest watermark.", 0.0, 1.0, _d("feedback.watermark.min"), True),
        "max": n("Highest watermark.", 0.0, 1.0, _d("feedback.watermark.max"), True),
        "maxStep": n("Largest change per period.", 0.001, 1.0, _d("feedback.watermark.maxStep"))},
        default={}, rules=[("self.min <= self.max", "watermark.min must be <= watermark.max"),
                           ("self.max < 1.0", "watermark.max must be below 1")])
    bound_step = o(
        "Step token budget: tokens one engine step may process, decode rows and prefill chunks together (the "
        "prefill chunk size). The engine starts at engine.scheduler.maxNumBatchedTokens and never goes above "
        "it; the coordinator lowers the budget while TPOT misses targets.tpotP50Seconds (prefills wait, "
        "decode rows keep their per-token latency) and raises it again when TPOT has room or nothing "
        "decodes. Set min = max to fix it. Without chunked prefill it stays where the engine puts it (at "
        "least maxModelLen).", {
            "min": i(f"Lowest budget (default {SB.DEFAULT_MIN}, or max when smaller).", SB.FLOOR, 1048576),
            "max": i("Highest budget (default and ceiling: engine.scheduler.maxNumBatchedTokens).", SB.FLOOR,
                     1048576),
            "maxStep": i("Largest change per decision, in tokens.", 1, 1048576,
                         _d("feedback.stepTokenBudget.maxStep"))},
        default={}, rules=SB.bounds_rules())
    feedback = o("The sidecar's feedback coordinator (reloaded without a restart).", {
        "mode": s("off: no coordinator; observe: decide and log only; enforce: write targets.",
                  ["off", "observe", "enforce"], _d("feedback.mode")),
        "intervalSeconds": i("Coordinator period.", 1, 3600, _d("feedback.intervalSeconds")),
        "staleAfterSeconds": i("Feedback older than this is stale (engine falls back to defaults).", 2, 86400,
                               _d("feedback.staleAfterSeconds")),
        "batchCap": bound_cap,
        "watermark": bound_w,
        "stepTokenBudget": bound_step,
        "eventPath": o("Between periodic decisions, react within a second to a preemption burst or a "
                       "fast-growing queue.",
                       {"enabled": b("React between periods.", _d("feedback.eventPath.enabled"))},
                       default={}),
        "targets": o("Objectives the coordinator steers towards (none by default: the measured default runs "
                     "had none; engine/core/defaults.py).", {
            "ttftP99Seconds": n("P99 time-to-first-token objective (unset: none).", 0.001, 600.0),
            "tpotP50Seconds": n("P50 time-per-output-token objective (after the first token) the step token "
                                "budget is steered to (unset: none, the budget holds the engine's).",
                                0.001, 60.0),
            "maxQueueDepth": i("Waiting requests tolerated before the cap grows.", 0, 100000,
                               _d("feedback.targets.maxQueueDepth"))}, default={}),
    }, default={}, rules=[("self.staleAfterSeconds >= 2 * self.intervalSeconds",
                           "staleAfterSeconds must be at least twice intervalSeconds")])
    def slo_field(key: str, desc: str) -> dict[str, Any]:
        return n(desc, *SLO_BOUNDS[key], _d(f"slo.{key}"))

    slo = o("The service-level objective: a request is good when its time to first token is within "
            "ttftSeconds + ttftPerThousandPromptTokensSeconds per 1,000 prompt tokens and its mean time per "
            "output token within tpotSeconds. The engine counts every finished request against it "
            "(kvloop:slo_good_total, kvloop:slo_missed_total{reason}); goodput is good requests per "
            "second. The defaults are kvloop serve's, at CPU scale (engine/core/defaults.py).", {
        "ttftSeconds": slo_field("ttftSeconds", "Time to first token allowed to every request, seconds."),
        "ttftPerThousandPromptTokensSeconds": slo_field(
            "ttftPerThousandPromptTokensSeconds",
            "Time to first token allowed on top per 1,000 prompt tokens, seconds (0: the same for every "
            "prompt)."),
        "tpotSeconds": slo_field("tpotSeconds", "Mean time per output token allowed (after the first), "
                                 "seconds.")}, default={})
    toleration = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    props = {
        "replicas": i("Number of engine pods.", 0, 256, _d("replicas")),
        "model": model,
        "images": o("Image overrides (default: the operator's image).", {
            "engine": image("engine", "Engine image."),
            "sidecar": image("sidecar", "Sidecar image (default: engine image)."),
            "fetcher": image("fetcher", "Model fetcher init image (default: engine image)."),
            "pullPolicy": s("Image pull policy.", ["Always", "IfNotPresent", "Never"], "IfNotPresent")}),
        "imagePullSecrets": {"type": "array", "description": "Pull secrets for the images.",
                             "items": o("A secret reference.", {"name": s("Secret name.")},
                                        required=["name"])},
        "resources": resources("resources", "Engine container resources, including nvidia.com/gpu "
                               f"(default: {_describe(L.DEFAULT_ENGINE_RESOURCES)})."),
        "sidecarResources": resources("sidecarResources", f"Sidecar container resources (default: "
                                      f"{_describe(L.SIDECAR_RESOURCES)}; limits.memory at least "
                                      f"{L.SIDECAR_FLOORS['memory']}).",
                                      L.SIDECAR_FLOORS),
        "engine": engine,
        "feedback": feedback,
        "slo": slo,
        "observability": o("Monitoring.", {
            "logLevel": s("Log level of engine and sidecar.", ["debug", "info", "warning", "error"],
                          _d("observability.logLevel")),
            "serviceMonitor": o("Create a Prometheus Operator ServiceMonitor.", {
                "enabled": b("Create it.", _d("observability.serviceMonitor.enabled")),
                "interval": s("Scrape interval.", default=_d("observability.serviceMonitor.interval"),
                              pattern=r"^[0-9]+(ms|s|m|h)$"),
                "labels": {"type": "object", "description": "Extra labels (to match a Prometheus selector).",
                           "additionalProperties": {"type": "string"}}}, default={})}, default={}),
        "routing": routing_schema(),
        "service": o("The Service in front of the pods.", {
            "type": s("Service type.", ["ClusterIP", "NodePort", "LoadBalancer"], _d("service.type")),
            "port": i("Service port for the OpenAI API.", 1, 65535, _d("service.port"))}, default={}),
        "podDisruptionBudget": o("Created when replicas > 1.", {
            "maxUnavailable": i("Pods that may be down at once during voluntary disruption.", 1, 256,
                                _d("podDisruptionBudget.maxUnavailable"))}, default={}),
        "nodeSelector": {"type": "object", "description": "Node labels the pods must match.",
                         "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array",
                        "description": "Pod tolerations (one for nvidia.com/gpu is added with GPUs).",
                        "items": toleration},
        "affinity": {"type": "object", "description": "Pod affinity.",
                     "x-kubernetes-preserve-unknown-fields": True},
        "priorityClassName": s("Pod priority class."),
        "runtimeClassName": s("Pod runtime class (e.g. nvidia)."),
    }
    return o("Desired state of an InferenceService.", props, rules=[
        ("self.feedback.mode == 'off' || self.feedback.batchCap.max >= self.feedback.batchCap.min",
         "feedback bounds are inconsistent"),
        ("self.engine.kvCache.retentionWatermark >= self.feedback.watermark.min && "
         "self.engine.kvCache.retentionWatermark <= self.feedback.watermark.max",
         "engine.kvCache.retentionWatermark must lie within feedback.watermark bounds"),
        ("self.engine.scheduler.maxNumSeqs >= self.feedback.batchCap.min && "
         "self.engine.scheduler.maxNumSeqs <= self.feedback.batchCap.max",
         "engine.scheduler.maxNumSeqs (the engine's batch cap) must lie within feedback.batchCap bounds"),
        *SB.spec_rules(),
        *memory_rules(),
    ])


def status_schema() -> dict[str, Any]:
    cond = o("A condition (Kubernetes API conventions).", {
        "type": s("Ready, Progressing, Degraded, FeedbackHealthy, Reconciling or Stalled."),
        "status": s("True, False or Unknown.", ["True", "False", "Unknown"]),
        "reason": s("CamelCase reason."), "message": s("Human-readable detail."),
        "observedGeneration": i("Generation the condition was computed for."),
        "lastTransitionTime": s("When status last changed.", format="date-time")},
        required=["type", "status"])
    out = o("Observed state, written by the operator only.", {
        "observedGeneration": i("Last generation the operator reconciled."),
        "conditions": {"type": "array", "description": "Current conditions.", "items": cond,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        "replicas": i("Pods of the Deployment."), "readyReplicas": i("Ready pods."),
        "selector": s("Label selector of the pods (for the scale subresource)."),
        "url": s("In-cluster URL of the OpenAI-compatible API."),
        "feedback": {"type": "object",
                     "description": "Aggregated sidecar feedback (targets per pod, last decision).",
                     "x-kubernetes-preserve-unknown-fields": True},
    })
    out["x-kubernetes-preserve-unknown-fields"] = True  # never prune status fields
    return out


def crd() -> dict[str, Any]:
    ready = '.status.conditions[?(@.type=="Ready")].status'
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{C.PLURAL}.{C.GROUP}", "labels": {"app.kubernetes.io/part-of": "kvloop"}},
        "spec": {
            "group": C.GROUP,
            "names": {"kind": C.KIND, "listKind": f"{C.KIND}List", "plural": C.PLURAL,
                      "singular": C.KIND.lower(), "shortNames": [C.SHORT_NAME],
                      "categories": ["kvloop", "all"]},
            "scope": "Namespaced",
            "versions": [{
                "name": C.VERSION, "served": True, "storage": True,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                          "statusReplicasPath": ".status.replicas",
                                                          "labelSelectorPath": ".status.selector"}},
                "additionalPrinterColumns": [
                    {"name": "Ready", "type": "string", "jsonPath": ready},
                    {"name": "Replicas", "type": "string", "jsonPath": ".status.readyReplicas",
                     "description": "Ready pods"},
                    {"name": "Hit rate", "type": "number", "jsonPath": ".status.feedback.hitRate",
                     "description": "Prefix cache hit rate over the last period (mean of pods)"},
                    {"name": "Batch cap", "type": "integer", "jsonPath": ".status.feedback.batchCap.max"},
                    {"name": "Step budget", "type": "integer",
                     "jsonPath": ".status.feedback.stepTokenBudget.max",
                     "description": "Step token budget (prefill chunk size) the sidecars target (largest of "
                     "pods)"},
                    {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 0},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An LLM served by kvloop: engine pods with a feedback sidecar.",
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {**spec_schema(), "default": {}},
                        "status": status_schema(),
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.metadata.name.size() <= 52",
                        "message": "name must be at most 52 characters (child names add suffixes)"}],
                }},
            }],
        },
    }


def render_yaml() -> str:
    header = "# Generated by `python -m kvloop.operator.crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render_yaml())
