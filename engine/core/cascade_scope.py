"""Which shared prefixes a decode step may cascade: a mode's scope (Policy.cascade_groups), read by the
cascade plan (engine/cascade). On the ground floor, because the policies that name a scope live here too."""

from __future__ import annotations

NESTED = "nested"  # any prefix two or more rows share, nested ones included
COMMON = "common"  # only the prefix common to every row (vLLM's cascade)
SCOPES = (NESTED, COMMON)
