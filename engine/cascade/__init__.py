"""Cascade decode, decided once: which rows share which prefix (tree.py), which of those a step cascades
(plan.py: one planner, read as whole plans by the runner and as group shapes by the pricing), what a shared
scope costs (cost.py) and a decode step's price (step_cost.py). The scopes are engine/core/cascade_scope.py's.
Pure Python; the runner, the scheduler's pricing, the kernels' metadata and the simulator all read it."""
