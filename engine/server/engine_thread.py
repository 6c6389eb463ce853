"""One OS thread for all of the engine's torch work: loading the model, compiling its step, every step after.

Why one: libgomp keeps a pool of worker threads for each thread that starts a parallel region, and once a
process manages more OpenMP threads than it has CPUs, it throttles their spin-wait to a few hundred spins
before they sleep on a futex, so every parallel region pays a wake-up. Loading the model in the main thread
and stepping in another left two pools on a 2-core machine, and slower steps (docs/engine_history.md)."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any


class EngineThread(threading.Thread):
    """A daemon thread that runs the jobs handed to it, in order, until `finish`."""

    def __init__(self, name: str = "kvloop-engine"):
        super().__init__(name=name, daemon=True)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

    def submit(self, fn: Callable, *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, args, future))
        return future

    def call(self, fn: Callable, *args: Any) -> Any:
        """fn(*args) on this thread; its result, or its exception raised here."""
        return self.submit(fn, *args).result()

    def finish(self) -> None:
        """The thread ends once the jobs already handed to it are done."""
        self._jobs.put(None)
