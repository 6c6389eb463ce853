"""The engine's end of the loop: after every step, publish the snapshot and apply the targets.

Duck-typed against EngineCore (no torch import here). The batch cap goes to the scheduler (its
setter when it has one, else `config.max_num_seqs`); the watermark to `engine.kv.set_watermark`
when the KV manager has that method."""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.records import Targets

TTFT_WINDOW = 256  # recent first tokens that the TTFT percentiles cover
IDLE_HEARTBEAT_S = 1.0


class EngineControl:
    """`after_step` runs on the engine's thread. A server loop that stops stepping while idle would
    leave the snapshot stale and the targets unpolled, so a heartbeat thread does the same work when
    no step has run for `heartbeat_s` (under a lock: one writer at a time in the block)."""

    def __init__(self, link: ControlLink):
        self.link = link
        self.ttfts: deque[float] = deque(maxlen=TTFT_WINDOW)
        self._pcts = (math.nan, math.nan)
        self._dirty = False
        self.applied: Targets | None = None
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def attach(cls, engine, path: str | os.PathLike, stale_after_s: float = 120.0,
               heartbeat_s: float | None = IDLE_HEARTBEAT_S) -> EngineControl:
        """Opens (or creates) the block with the engine's configured values as the defaults."""
        defaults = Targets(batch_cap=engine.scheduler.config.max_num_seqs,
                           watermark=getattr(engine.kv, "watermark", None))
        hook = cls(ControlLink(path, defaults, stale_after_s=stale_after_s))
        if heartbeat_s:
            hook.start_heartbeat(engine, heartbeat_s)
        return hook

    def start_heartbeat(self, engine, period_s: float) -> None:
        ref = weakref.ref(engine)  # the thread must not keep a dropped engine alive

        def beat() -> None:
            while not self._stop.wait(period_s):
                eng = ref()
                if eng is None:
                    return
                if time.monotonic() - self._last >= period_s:
                    self.after_step(eng, [])
                del eng

        self._thread = threading.Thread(target=beat, name="kvloop-control-heartbeat", daemon=True)
        self._thread.start()

    def after_step(self, engine, outputs) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._after_step(engine, outputs)

    def _after_step(self, engine, outputs) -> None:
        for out in outputs:
            if out.num_output_tokens == 1 and out.first_token_time is not None:
                self.ttfts.append(max(0.0, out.first_token_time - out.arrival_time))
                self._dirty = True
        snap = engine.snapshot()
        snap["ttft_p50_s"], snap["ttft_p99_s"] = self._percentiles()
        for tier in ("host", "disk"):  # the KV manager reports blocks per tier; the block carries shares
            total = snap.get(f"kv_{tier}_blocks_total")
            if total:
                snap[f"kv_use_{tier}"] = snap.get(f"kv_{tier}_blocks_used", 0) / total
        self.link.publish(snap)
        targets = self.link.poll_targets()
        if targets is not None and not targets.same_values(self.applied):
            apply_targets(engine, targets)
            self.applied = targets

    def _percentiles(self) -> tuple[float, float]:
        if self._dirty:
            xs = sorted(self.ttfts)
            n = len(xs)
            self._pcts = (xs[(n - 1) // 2], xs[min(n - 1, math.ceil(0.99 * n) - 1)])
            self._dirty = False
        return self._pcts

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            self.link.close()


def apply_targets(engine, t: Targets) -> None:
    if t.batch_cap is not None:
        sched = engine.scheduler
        setter = getattr(sched, "set_batch_cap", None)
        if setter is not None:
            setter(t.batch_cap)
        else:
            sched.config.max_num_seqs = t.batch_cap
    if t.watermark is not None:
        setter = getattr(engine.kv, "set_watermark", None)
        if setter is not None:
            setter(t.watermark)
