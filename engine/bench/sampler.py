"""A background thread that calls `sample()` every `interval_s` while a `with` block runs.

Subclasses record what they measure in `sample()`; `begin()` runs once on the thread before the first
wait, for a sampler that measures differences against a starting reading."""

from __future__ import annotations

import threading
from typing import Self


class BackgroundSampler:
    thread_name = "background-sampler"

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        """Runs on the sampling thread before the first interval; nothing by default."""

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        self.begin()
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
