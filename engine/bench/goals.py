"""One benchmark goal in the project's shape: {name, value, op, bound, met}, `met` computed from the value."""

from __future__ import annotations


def goal(name: str, value: float | None, op: str, bound: float, **extra) -> dict:
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', got {op!r}")
    met = value is not None and (value >= bound if op == ">=" else value <= bound)
    return {"name": name, "value": value, "op": op, "bound": bound, "met": met, **extra}
