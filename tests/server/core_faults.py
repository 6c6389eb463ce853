"""Engine builders with a fault, for the engine core process (which must import them: module level)."""

from __future__ import annotations

from kvloop.engine.engine_core import WARMUP_REQUEST_ID, EngineCore


def broken_scheduler_core(config) -> EngineCore:
    """An EngineCore whose scheduler raises once a client request waits (the warm-up goes through)."""
    engine = EngineCore(config)
    schedule = engine.scheduler.schedule

    def broken():
        if any(s.request_id != WARMUP_REQUEST_ID for s in engine.scheduler.waiting):
            raise RuntimeError("scheduler bug")
        return schedule()

    engine.scheduler.schedule = broken
    return engine
