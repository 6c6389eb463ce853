"""While idle, the engine thread still steps every IDLE_TICK_S: an empty step is what publishes the control
block's snapshot and polls the sidecar's targets (engine/control/hook.py runs no thread of its own)."""

from __future__ import annotations

import asyncio
import threading

from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.server.async_engine import IDLE_TICK_S, AsyncEngine


class IdleEngine:
    """No requests ever: counts the engine thread's (empty) steps."""

    def __init__(self):
        self.steps = 0
        self.stepped = threading.Condition()

    def has_unfinished(self) -> bool:
        return False

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot()

    def step(self) -> list:
        with self.stepped:
            self.steps += 1
            self.stepped.notify_all()
        return []


def test_idle_engine_thread_keeps_stepping():
    engine, loop = IdleEngine(), asyncio.new_event_loop()
    async_engine = AsyncEngine(engine, exit_on_death=False)
    async_engine.start(loop, warmup=False)
    try:
        with engine.stepped:
            assert engine.stepped.wait_for(lambda: engine.steps >= 2, timeout=20 * IDLE_TICK_S)
    finally:
        async_engine.shutdown()
        loop.close()
    assert async_engine.dead is None
