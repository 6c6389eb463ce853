"""Arrival processes (pure Python): Poisson, or gamma with a burstiness factor as
`vllm bench serve` has it."""

from __future__ import annotations

import random


def arrival_times(n: int, rate: float, rng: random.Random, burstiness: float = 1.0,
                  start: float = 0.0) -> list[float]:
    """n arrival times (seconds) at `rate` requests/s. burstiness 1.0 is Poisson; below 1 is burstier,
    above 1 more regular (gamma inter-arrivals with shape=burstiness, mean 1/rate). rate <= 0 or inf:
    everything arrives at `start` (an offline batch)."""
    if n <= 0:
        return []
    if rate <= 0 or rate == float("inf"):
        return [start] * n
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    theta = 1.0 / (rate * burstiness)
    t = start
    out = []
    for _ in range(n):
        t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out


def zipf_weights(n: int, s: float) -> list[float]:
    """Zipf popularity of n items (item 0 most popular), normalised."""
    w = [1.0 / (k + 1) ** s for k in range(n)]
    total = sum(w)
    return [x / total for x in w]


def arrivals_between(start: float, end: float, rate: float, rng: random.Random,
                     burstiness: float = 1.0) -> list[float]:
    """Arrival times in [start, end) at `rate` requests/s (Poisson for burstiness 1.0, gamma otherwise, as
    arrival_times): a stream that runs for a window (one phase) rather than for a count. rate <= 0: none."""
    if rate <= 0 or end <= start:
        return []
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    theta = 1.0 / (rate * burstiness)
    out, t = [], start
    while True:
        t += rng.gammavariate(burstiness, theta)
        if t >= end:
            return out
        out.append(t)
