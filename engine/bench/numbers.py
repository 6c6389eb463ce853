"""Numbers in reports: what counts as a measured value, and how a table cell shows one."""

from __future__ import annotations

import math


def is_number(x: object) -> bool:
    """A measured value: an int or float that is not NaN (None, strings and NaN are 'not measured')."""
    return isinstance(x, int | float) and not (isinstance(x, float) and math.isnan(x))


def fmt(x: object, digits: int = 2, scale: float = 1.0) -> str:
    """x * scale with `digits` decimals, or an em dash where x is not a measured value."""
    return f"{x * scale:.{digits}f}" if is_number(x) else "—"
