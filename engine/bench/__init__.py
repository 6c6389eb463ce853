"""Benchmark harness: workloads W1-W4, arrivals, trace readers, targets, metrics, report.

`workloads`, `arrivals`, `traces` and `metrics` are pure Python (no torch) so the simulator can use them."""
