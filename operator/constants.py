"""Names shared by the CRD, the operator, the manifests and the tests."""

GROUP = "kvloop.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
SHORT_NAME = "kvis"
API_VERSION = f"{GROUP}/{VERSION}"

MANAGER = "kvloop-operator"
FINALIZER = "kvloop.io/finalizer"
FEEDBACK_ANNOTATION = "kvloop.io/feedback"

ENGINE_PORT = 8000
SIDECAR_PORT = 9090
CONTROL_DIR = "/run/kvloop"
CONTROL_PATH = f"{CONTROL_DIR}/control.bin"
CONFIG_DIR = "/etc/kvloop"
MODEL_DIR = "/models"
KV_DISK_DIR = "/var/cache/kvloop/kv"

DEFAULT_IMAGE = "ghcr.io/kvloop/kvloop:0.1.0"
EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select the pods of one InferenceService (immutable once a Deployment exists)."""
    return {"app.kubernetes.io/name": "kvloop", "app.kubernetes.io/instance": name}


def common_labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": "inference",
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "kvloop",
    }

# The managed remote KV store (spec.engine.kvCache.remote.managed): Valkey, pinned, and its port.
VALKEY_IMAGE = "docker.io/valkey/valkey:8.1.3"
VALKEY_PORT = 6379
VALKEY_DATA_DIR = "/data"
# The engine reads the remote store's password from this variable only (never a flag or a file key).
KV_REMOTE_PASSWORD_ENV = "KVLOOP_KV_REMOTE_PASSWORD"

# The endpoint picker (Gateway API Inference Extension) for spec.routing.mode InferencePool: the upstream
# picker scores prefixes it estimates from its own routing; llm-d's scheduler (an EPP build with more
# plugins) scores from the pods' KV events ("precise"). Ports: the EPP's defaults (gRPC ext-proc 9002,
# gRPC health 9003, metrics 9090; gateway-api-inference-extension cmd/epp options).
EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0"
EPP_PRECISE_IMAGE = "ghcr.io/llm-d/llm-d-inference-scheduler:v0.7.0"
EPP_GRPC_PORT = 9002
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
# Where each pod publishes its KV events for a precise picker (ZeroMQ PUB; llm-d's pod discovery connects
# to this port on every pod of the pool).
KV_EVENTS_PORT = 5557
