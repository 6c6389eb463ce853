"""Resource rules shared by the CRD (CEL, refused at `kubectl apply`) and the operator (Degraded for
objects stored before the rules existed): one table, two renderings (crd.py and spec.py).

Quantities follow Kubernetes' grammar exactly (resource.Quantity), as exact fractions.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

# The engine container's resources when spec.resources is absent (render_pod.py uses them).
DEFAULT_ENGINE_RESOURCES: dict[str, Any] = {"requests": {"cpu": "1", "memory": "2Gi"},
                                            "limits": {"memory": "4Gi"}}
SIDECAR_RESOURCES: dict[str, Any] = {"requests": {"cpu": "50m", "memory": "64Mi"},
                                     "limits": {"memory": "128Mi"}}
# The sidecar (Python, uvicorn, prometheus_client) idles at ~54 MiB RSS; below this limit it is
# OOM-killed while starting or under scrape load.
SIDECAR_FLOORS: dict[str, str] = {"memory": "96Mi"}
# Resources whose requests and limits are compared and which must not be negative.
CHECKED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")
# Memory the engine process needs beside its KV pools (interpreter, torch, the embedded model).
RUNTIME_HEADROOM_MIB = 1024

# OCI/Docker image reference: [domain[:port]/]lowercase-path[:tag][@algorithm:hex-digest].
# No backslashes: the pattern is embedded in a CEL string literal, where `\.` is no valid escape.
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL})(?:[.]{_LABEL})*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
IMAGE_MESSAGE = "must be an image reference such as registry.example.com/team/name:tag or name@sha256:<hex>"

_QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:[.][0-9]*)?|[.][0-9]+)"
                       r"(?:([KMGTPE]i)|([numkMGTPE]?)|[eE]([+-]?[0-9]+))$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# The schema's pattern for quantity strings (int-or-string fields); parse_quantity is the exact parser.
QUANTITY_PATTERN = _QUANTITY.pattern


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity ('500m', '4Gi', '1e3', 2) as an exact number; ValueError when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    sign, number, binary, decimal, exponent = match.groups()
    amount = Fraction(number if not number.endswith(".") else number[:-1])
    if binary:
        amount *= 1024 ** _BINARY[binary]
    elif exponent is not None:
        amount *= Fraction(10) ** int(exponent)
    else:
        amount *= Fraction(10) ** _DECIMAL[decimal or ""]
    return -amount if sign == "-" else amount


def quantity_or_none(value: Any) -> Fraction | None:
    """parse_quantity, with None for an absent or malformed value (the checks skip those)."""
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def is_quantity(value: Any) -> bool:
    return quantity_or_none(value) is not None


def has_gpu(resources: dict[str, Any] | None) -> bool:
    gpus = quantity_or_none(((resources or {}).get("limits") or {}).get("nvidia.com/gpu"))
    return gpus is not None and gpus > 0


def ram_pools_mib(spec: dict[str, Any]) -> int:
    """KV pool MiB held in the pod's RAM: the host pool, plus the device pool when it runs on CPU."""
    kv = spec["engine"]["kvCache"]
    return kv["hostPoolMiB"] + (0 if has_gpu(spec.get("resources")) else kv["devicePoolMiB"])


def resource_problems(field: str, resources: dict[str, Any] | None, floors: dict[str, str]) -> list[str]:
    """Negative quantities, requests above limits, and limits below the floors, for one container."""
    out: list[str] = []
    res = resources or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    for part, values in (("requests", requests), ("limits", limits)):
        for key in CHECKED_RESOURCES:
            value = quantity_or_none(values.get(key))
            if value is not None and value < 0:
                out.append(negative_message(field, part, key))
    for key in CHECKED_RESOURCES:
        request, limit = quantity_or_none(requests.get(key)), quantity_or_none(limits.get(key))
        if request is not None and limit is not None and request > limit:
            out.append(above_limit_message(field, key))
    for key, floor in floors.items():
        limit = quantity_or_none(limits.get(key))
        if limit is not None and limit < parse_quantity(floor):
            out.append(floor_message(field, key, floor))
    return out


def memory_problems(spec: dict[str, Any]) -> list[str]:
    """The RAM pools and the runtime headroom must fit the engine's memory limit (the default one too)."""
    resources = spec.get("resources")
    limit = quantity_or_none(((DEFAULT_ENGINE_RESOURCES if resources is None else resources).get("limits")
                              or {})
                             .get("memory"))
    if limit is None:
        return []
    if (ram_pools_mib(spec) + RUNTIME_HEADROOM_MIB) * 2**20 > limit:
        return [pools_message(default=resources is None)]
    return []


def negative_message(field: str, part: str, key: str) -> str:
    return f"{field}.{part}.{key} must not be negative"


def above_limit_message(field: str, key: str) -> str:
    return f"{field}.requests.{key} must not exceed {field}.limits.{key}"


def floor_message(field: str, key: str, floor: str) -> str:
    return f"{field}.limits.{key} must be at least {floor} (the sidecar does not start below it)"


def pools_message(default: bool) -> str:
    where = (f"the default memory limit {DEFAULT_ENGINE_RESOURCES['limits']['memory']} (spec.resources unset)"
             if default else "the memory limit resources.limits.memory")
    return (f"engine.kvCache pools in RAM (hostPoolMiB, plus devicePoolMiB without a GPU) plus "
            f"{RUNTIME_HEADROOM_MIB} MiB for the runtime must fit {where}")


def image_message(key: str) -> str:
    return f"images.{key} {IMAGE_MESSAGE}"


def image_problems(images: dict[str, Any] | None) -> list[str]:
    return [image_message(key) for key, ref in (images or {}).items()
            if key != "pullPolicy" and isinstance(ref, str) and not re.match(IMAGE_REFERENCE, ref)]
