"""The background sampler the noise guard and the peak-memory meter share: begin() once on its thread, then
sample() every interval until the with-block ends; and each of the two measuring through it."""

from __future__ import annotations

import subprocess
import sys
import threading

from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.process_memory import PeakMemory
from kvloop.engine.bench.sampler import BackgroundSampler


class Counting(BackgroundSampler):
    thread_name = "counting"

    def __init__(self) -> None:
        super().__init__(interval_s=0.001)
        self.began_on: str | None = None
        self.samples = 0
        self.three = threading.Event()

    def begin(self) -> None:
        self.began_on = threading.current_thread().name

    def sample(self) -> None:
        self.samples += 1
        if self.samples == 3:
            self.three.set()


def test_begins_on_its_thread_samples_until_the_block_ends():
    with Counting() as c:
        assert c.three.wait(30)
    assert c.began_on == "counting" and not c._thread.is_alive()
    done = c.samples
    assert c._stop.is_set() and c.samples == done  # stopped: no sample after the block


def test_noise_guard_reports_one_interval_per_sample():
    guard = NoiseGuard(max_other_cores=1e9)
    guard.begin()
    sum(range(200_000))  # some CPU of our own between the readings
    guard.sample()
    report = guard.report()
    assert report.samples == 1 and not report.noisy and report.other_cores_mean >= 0.0


def test_peak_memory_counts_the_processes_started_under_it():
    memory = PeakMemory()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        memory.sample()
    finally:
        child.communicate(b"")
    assert memory.peak_rss_mib > 0 and memory.as_dict()["peak_pss_mib"] > 0
