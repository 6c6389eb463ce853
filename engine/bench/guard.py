"""Quiet-machine guard: how much CPU other processes used while a run was measured.

A background thread samples the machine's busy CPU time and our own processes' (the harness and any
server it started, with their children) every `interval_s`; the difference is everyone else's load, in
cores. A run whose mean outside load exceeds `max_other_cores` is flagged noisy (the caller may redo it).
Every `probe_every_s` it also times the speed probe (speed_probe.py): how fast this machine itself ran, which
other processes' load does not show."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

from kvloop.engine.bench import speed_probe
from kvloop.engine.bench.sampler import BackgroundSampler


@dataclass
class NoiseReport:
    other_cores_mean: float
    other_cores_max: float
    ours_cores_mean: float
    cpu_count: int
    samples: int
    noisy: bool
    threshold_cores: float
    series: list[list[float]] = field(default_factory=list)  # [t, other cores]
    speed: dict = field(default_factory=dict)  # speed_probe.summary of the run's probes

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "series"} | {"series": self.series[-400:]}


def _busy(ct) -> float:
    return ct.user + ct.nice + ct.system + getattr(ct, "irq", 0.0) + getattr(ct, "softirq", 0.0) + getattr(
        ct, "steal", 0.0)


class NoiseGuard(BackgroundSampler):
    thread_name = "noise-guard"

    def __init__(self, pids: list[int] | None = None, interval_s: float = 0.5, max_other_cores: float = 0.3,
                 probe_every_s: float = 5.0):
        super().__init__(interval_s)
        self.pids = set(pids or []) | {os.getpid()}
        self.max_other_cores = max_other_cores
        self.probe_every_s = probe_every_s
        self._series: list[tuple[float, float, float]] = []
        self._probes: list[tuple[float, float]] = []
        self._next_probe = 0.0

    def _ours(self) -> float:
        total = 0.0
        for pid in list(self.pids):
            try:
                p = psutil.Process(pid)
                procs = [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
            for q in procs:
                try:
                    t = q.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        return total

    def begin(self) -> None:
        self._t0 = time.monotonic()
        self._last = (self._t0, _busy(psutil.cpu_times()), self._ours())

    def sample(self) -> None:
        last_t, last_busy, last_ours = self._last
        t, busy, ours = time.monotonic(), _busy(psutil.cpu_times()), self._ours()
        dt = max(t - last_t, 1e-6)
        own = max(0.0, ours - last_ours) / dt
        other = max(0.0, (busy - last_busy) / dt - own)
        self._series.append((t - self._t0, other, own))
        if t >= self._next_probe:  # after the load readings, so its own CPU time counts in the next interval
            self._probes.append(speed_probe.probe_ms())
            self._next_probe = t + self.probe_every_s
        self._last = (t, busy, ours)

    def report(self) -> NoiseReport:
        s = self._series
        other = [x[1] for x in s]
        ours = [x[2] for x in s]
        mean = sum(other) / len(other) if other else 0.0
        return NoiseReport(mean, max(other, default=0.0), sum(ours) / len(ours) if ours else 0.0,
                           psutil.cpu_count() or 1, len(s), mean > self.max_other_cores, self.max_other_cores,
                           [[round(t, 2), round(o, 3)] for t, o, _ in s], speed_probe.summary(self._probes))
