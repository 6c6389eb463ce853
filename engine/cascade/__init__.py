"""Cascade decode, decided once: which rows share which prefix (plan.py), what a shared scope costs
(cost.py), and the plan's shapes for pricing (shapes.py). Pure Python; the runner, the scheduler's pricing,
the kernels' metadata and the simulator all read it."""
