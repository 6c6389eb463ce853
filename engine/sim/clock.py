"""Points the scheduler's timestamps at the virtual clock. The scheduler stamps first_scheduled_time
and finished_time (and may time batch fills or aging) with `time.monotonic()`; the simulator swaps
the `time` name those modules see for a stand-in for the duration of a run. No scheduler code
changes: only where its clock reads come from."""

from __future__ import annotations

import contextlib
import sys
import time as _time
from collections.abc import Callable, Iterator

PATCHED_MODULES = ("kvloop.engine.scheduler.scheduler", "kvloop.engine.scheduler.sequence")


class VirtualTime:
    """Quacks like the `time` module for the calls the scheduler makes."""

    def __init__(self, now: Callable[[], float]):
        self._now = now

    def monotonic(self) -> float:
        return self._now()

    def perf_counter(self) -> float:
        return self._now()

    def time(self) -> float:
        return self._now()

    def __getattr__(self, name: str):  # sleep, strftime, ...: the real ones
        return getattr(_time, name)


@contextlib.contextmanager
def virtual_clock(now: Callable[[], float]) -> Iterator[None]:
    stand_in = VirtualTime(now)
    saved = []
    for name in PATCHED_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "time", None) is _time:
            saved.append(mod)
            mod.time = stand_in
    try:
        yield
    finally:
        for mod in saved:
            mod.time = _time
