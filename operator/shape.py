"""Type checks of a stored InferenceService spec against the CRD's structural schema.

The API server validates what is applied, but an object can be stored without that check (written
before the CRD had its schema, restored from a backup, or by a fake API server). The handlers read
every spec through `shape_problems` first, so a field of the wrong type becomes a Degraded message
naming the field instead of an exception in the middle of rendering.
"""

from __future__ import annotations

import functools
from typing import Any

JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}


@functools.cache
def _spec_node() -> dict[str, Any]:
    from kvloop.operator.crd import spec_schema  # the one schema, also served as the CRD

    return spec_schema()


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return next((name for name, t in JSON_TYPES.items() if name != "number" and isinstance(value, t)),
                "number")


def _expected(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "an integer or a string"
    if "anyOf" in node:
        return " or ".join(_expected(alt) for alt in node["anyOf"])
    return f"{'an' if node['type'][0] in 'aeio' else 'a'} {node['type']}"


def _type_ok(value: Any, node: dict[str, Any]) -> bool:
    if node.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    if "anyOf" in node:
        return any(_type_ok(value, alt) for alt in node["anyOf"])
    kind = node.get("type")
    if kind is None:
        return True
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, JSON_TYPES[kind])


def shape_problems(value: Any, node: dict[str, Any] | None = None, path: str = "spec") -> list[str]:
    """One sentence per field whose JSON type the schema does not allow (values and
    ranges are not checked)."""
    node = _spec_node() if node is None else node
    if value is None and node.get("nullable"):
        return []
    if not (node.get("type") or "anyOf" in node or node.get("x-kubernetes-int-or-string")):
        return []
    if not _type_ok(value, node):
        return [f"{path} must be {_expected(node)}, not {json_type(value)}"]
    out: list[str] = []
    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for key, sub_value in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                out += shape_problems(sub_value, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            out += shape_problems(item, node["items"], f"{path}[{i}]")
    return out
