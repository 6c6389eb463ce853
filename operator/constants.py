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
