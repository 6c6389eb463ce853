"""Validation of custom resources against the CRD, the way the API server would do it offline.

The openAPIV3Schema is converted to JSON Schema (draft 2020-12) with unknown fields rejected, as
`kubectl apply --validate=strict` does; defaults are applied like the API server's defaulting;
then every `x-kubernetes-validations` CEL rule is evaluated with cel-python on its node.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from celpy import celtypes

from kvloop.operator.limits import is_quantity, parse_quantity

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "manifests" / "base" / "crd.yaml"


def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def openapi_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def to_json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [to_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")
           and k != "default"}
    if node.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    preserves = node.get("x-kubernetes-preserve-unknown-fields")
    if node.get("type") == "object" and "properties" in node and not preserves:
        out["additionalProperties"] = False
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    return out


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural-schema defaulting: fill absent fields that have defaults, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    elif schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # CEL sees schema numbers as doubles
    return value


def _rules(schema: dict[str, Any], value: Any, path: str) -> list[tuple[str, str, Any]]:
    found = [(path, r["rule"], value) for r in schema.get("x-kubernetes-validations") or []]
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                found += _rules(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            found += _rules(schema["items"], item, f"{path}[{n}]")
    return found


def all_rules(schema: dict[str, Any]) -> list[str]:
    out = [r["rule"] for r in schema.get("x-kubernetes-validations") or []]
    for sub in (schema.get("properties") or {}).values():
        out += all_rules(sub)
    if "items" in schema:
        out += all_rules(schema["items"])
    return out


class Quantity:
    """Kubernetes CEL's Quantity (k8s.io/apiserver/pkg/cel/library/quantity.go), which cel-python lacks:
    an exact value built from a quantity string; malformed strings are an evaluation error."""

    def __init__(self, text: Any):
        if not isinstance(text, str):
            raise TypeError(f"quantity() takes a string, got {type(text).__name__}")
        self.value = parse_quantity(str(text))


def _cmp(a: Quantity, b: Quantity) -> int:
    return (a.value > b.value) - (a.value < b.value)


def _as_integer(q: Quantity) -> celtypes.IntType:
    if q.value.denominator != 1 or not -(2**63) <= q.value < 2**63:
        raise ValueError("asInteger: not an int64")
    return celtypes.IntType(int(q.value))


def _plus(q: Quantity, other: Any, sign: int) -> Quantity:
    out = Quantity("0")
    out.value = q.value + sign * (other.value if isinstance(other, Quantity) else int(other))
    return out


QUANTITY_FUNCTIONS: dict[str, Any] = {
    "quantity": Quantity,
    "isQuantity": lambda text: celtypes.BoolType(is_quantity(str(text))),
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "isInteger": lambda q: celtypes.BoolType(q.value.denominator == 1 and -(2**63) <= q.value < 2**63),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.value)),
    "add": lambda q, other: _plus(q, other, 1),
    "sub": lambda q, other: _plus(q, other, -1),
}

_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def compile_rule(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule), functions=QUANTITY_FUNCTIONS)
    return _PROGRAMS[rule]


def validate(obj: dict[str, Any], crd: dict[str, Any] | None = None) -> list[str]:
    """Errors for one custom resource; empty when the API server would accept it."""
    schema = openapi_schema(crd or load_crd())
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in jsonschema.Draft202012Validator(to_json_schema(schema)).iter_errors(obj)]
    if errors:
        return errors  # the API server stops at schema errors too
    defaulted = apply_defaults(schema, copy.deepcopy(obj))
    for path, rule, value in _rules(schema, defaulted, "self"):
        ok = compile_rule(rule).evaluate({"self": celpy.json_to_cel(value)})
        if ok is not True and not (isinstance(ok, celpy.celtypes.BoolType) and bool(ok)):
            msg = next(r["message"] for r in _validations_at(schema, path) if r["rule"] == rule)
            errors.append(f"{path}: {msg}")
    return errors


def _validations_at(schema: dict[str, Any], path: str) -> list[dict[str, str]]:
    node = schema
    for part in path.split(".")[1:]:
        node = node["properties"][part.split("[")[0]]
        if "[" in part:
            node = node["items"]
    return node.get("x-kubernetes-validations") or []
