"""Peak memory of a process tree (a server and the workers it forks), sampled while a benchmark runs.

RSS summed over the tree is what `ps` and a container's limit see per process; it counts pages shared
between the tree's processes (libraries, fork copies) once per process, which overstates multi-process
servers. PSS splits each shared page among its sharers, so its sum is the tree's real footprint. Both
are kept; sampling every `interval_s` can miss a peak shorter than that."""

from __future__ import annotations

import os

import psutil

from kvloop.engine.bench.sampler import BackgroundSampler


def descendants_memory_mib(pid: int) -> tuple[float, float]:
    """(RSS summed, PSS summed) over pid's descendants (not pid itself), in MiB."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0.0, 0.0
    rss = pss = 0.0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue  # exited between the listing and the read
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss / 2**20, pss / 2**20


class PeakMemory(BackgroundSampler):
    """Context manager sampling the memory of every process `pid` (default: this one) has started, so a
    server is covered from its first moment (start-up included) without knowing its pid; the peaks are
    over all samples. Run one system at a time under it."""

    thread_name = "peak-memory"

    def __init__(self, pid: int | None = None, interval_s: float = 0.25):
        super().__init__(interval_s)
        self.pid = os.getpid() if pid is None else pid
        self.peak_rss_mib = 0.0
        self.peak_pss_mib = 0.0

    def sample(self) -> None:
        rss, pss = descendants_memory_mib(self.pid)
        self.peak_rss_mib = max(self.peak_rss_mib, rss)
        self.peak_pss_mib = max(self.peak_pss_mib, pss)

    def as_dict(self) -> dict:
        return {"peak_rss_mib": round(self.peak_rss_mib, 1), "peak_pss_mib": round(self.peak_pss_mib, 1)}
