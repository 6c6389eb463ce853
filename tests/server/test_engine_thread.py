"""The engine thread (engine/server/engine_thread.py): the thread that builds the engine is the one that steps
it (one OpenMP pool), jobs run in order, a job's exception reaches its caller, and the
thread ends on finish."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.engine_thread import EngineThread


class ThreadRecordingEngine:
    """Built on some thread; records the threads it is stepped on."""

    def __init__(self):
        self.built_on = threading.get_ident()
        self.stepped_on: set[int] = set()
        self.stepped = threading.Event()

    def has_unfinished(self) -> bool:
        return False

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot()

    def step(self) -> list:
        self.stepped_on.add(threading.get_ident())
        self.stepped.set()
        return []


def test_jobs_run_in_order_on_one_thread_and_errors_reach_the_caller():
    worker = EngineThread(name="test-engine")
    seen: list[tuple[int, int]] = []
    futures = [worker.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(5)]
    for f in futures:
        f.result(timeout=10)
    assert [i for i, _ in seen] == list(range(5))
    assert {ident for _, ident in seen} == {worker.ident} != {threading.get_ident()}
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    assert worker.call(lambda: 7) == 7  # a failed job does not stop the thread
    worker.finish()
    worker.join(timeout=10)
    assert not worker.is_alive()


def test_async_engine_steps_on_the_thread_that_built_the_engine():
    worker = EngineThread(name="test-engine")
    engine = worker.call(ThreadRecordingEngine)
    loop = asyncio.new_event_loop()
    async_engine = AsyncEngine(engine, exit_on_death=False, engine_thread=worker)
    async_engine.start(loop, warmup=False)
    try:
        assert engine.stepped.wait(timeout=10)
        engine_thread_id = async_engine.call_in_engine(lambda eng: threading.get_ident()).result(timeout=10)
        assert engine_thread_id == worker.ident
    finally:
        async_engine.shutdown()
        loop.close()
    assert engine.stepped_on == {engine.built_on} == {worker.ident}
    assert not worker.is_alive(), "the engine thread ends with the engine loop"
