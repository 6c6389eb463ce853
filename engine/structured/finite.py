"""Whether a JSON schema admits any finite document. llguidance resolves `$ref` lazily, so it cannot see a
cycle of references with no way out: an object whose required property is the object itself makes the
grammar force `{"x":{"x":...` until its own limits fail the request mid-generation. This is the least
fixpoint over the schema's local references; whatever it does not model counts as finite, so it refuses
only schemas that certainly have no document (the library judges the rest)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

LEAF_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})
MAX_VISITS = 200_000  # nodes visited in all rounds; past it the schema counts as finite (the library judges)
MAX_DEPTH = 100  # nesting followed (about 4 Python frames a level); deeper parts count as finite


class _Budget(Exception):
    """The check ran out of visits or depth: no verdict."""


def has_finite_document(schema: Any) -> bool:
    known: dict[str, bool] = {}  # reference -> its target has a finite document (False until shown)
    refs: set[str] = set()  # every local reference met so far
    visits = [0]
    try:
        while True:  # ends: a reference turns True at most once, and there are finitely many
            met = len(refs)
            verdict = _finite(schema, known, refs, visits, 0)
            flipped = False
            for ref in sorted(refs):
                if not known.get(ref):
                    target = _resolve(schema, ref)
                    known[ref] = target is None or _finite(target, known, refs, visits, 0)
                    flipped = flipped or known[ref]
            if not flipped and len(refs) == met:
                return verdict
    except _Budget:
        return True


def _finite(node: Any, known: dict[str, bool], refs: set[str], visits: list[int], depth: int) -> bool:
    visits[0] += 1
    if visits[0] > MAX_VISITS or depth > MAX_DEPTH:
        raise _Budget
    if node is False:
        return False
    if not isinstance(node, dict):
        return True

    def sub(child: Any) -> bool:
        return _finite(child, known, refs, visits, depth + 1)

    ref = node.get("$ref")
    if isinstance(ref, str):
        refs.add(ref)
        if not known.get(ref, False):
            return False
    if any(not sub(s) for s in _list(node.get("allOf"))):
        return False
    for key in ("anyOf", "oneOf"):
        options = _list(node.get(key))
        if options and not any(sub(s) for s in options):
            return False
    if "const" in node or "enum" in node:
        return True
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if types is None or types & LEAF_TYPES:
        return True
    return (("object" in types and _object_finite(node, sub))
            or ("array" in types and _array_finite(node, sub)))


def _object_finite(node: dict, sub) -> bool:
    if node.get("patternProperties"):
        return True  # which schema a required name falls under is left to the library
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    extra = node.get("additionalProperties", True)
    return all(sub(props.get(name, extra)) for name in _list(node.get("required")) if isinstance(name, str))


def _array_finite(node: dict, sub) -> bool:
    least = node.get("minItems", 0)
    if not isinstance(least, int) or least <= 0:
        return True
    items = node.get("items", True)
    prefix = node.get("prefixItems")
    if isinstance(items, list):  # draft 7's tuple form
        prefix, items = items, node.get("additionalItems", True)
    prefix = prefix if isinstance(prefix, list) else []
    needed = prefix[:least] + ([items] if least > len(prefix) else [])
    return all(sub(s) for s in needed)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _resolve(root: Any, ref: str) -> Any:
    """A local reference's target ("#", "#/$defs/a"...); None for anything else (the library resolves it)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdecimal() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
