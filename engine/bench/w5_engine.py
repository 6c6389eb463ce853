"""W5's systems on the real engine: a variant name (w5_variants) -> an in-process engine target, with the
sidecar's coordinator running beside it in a thread on the wall clock for `+coord` variants (the same
Coordinator class the sidecar runs, over a control block in shared memory)."""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import fields

from kvloop.engine.bench.sizing import Sizing, mode_configs
from kvloop.engine.bench.targets.engine import EngineTarget
from kvloop.engine.bench.w5_variants import coordinator_settings, parse_variant, sized


class CoordinatedEngineTarget(EngineTarget):
    """The engine with its control block, and the coordinator that steers it through that block."""

    def __init__(self, engine, name: str, settings, control_path: str):
        from kvloop.sidecar.coordinator import Coordinator
        from kvloop.sidecar.settings import SettingsWatcher

        super().__init__(engine, name)
        overrides = {f.name: getattr(settings, f.name) for f in fields(settings)}
        self.coordinator = Coordinator(SettingsWatcher(None, overrides), control_path=control_path)
        self.control_path = control_path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.coordinator.run, args=(self._stop,), daemon=True,
                                            name="w5-coordinator")
            self._thread.start()

    def info(self) -> dict:
        s = self.coordinator.status(limit=10_000)
        changes = [d for d in s["decisions"] if d["old"] != d["new"]]
        return {**super().info(), "feedback": {
            "period_s": s["period_s"], "final_batch_cap": s["batch_cap"], "final_watermark": s["watermark"],
            "changes": changes, "decisions_total": {f"{k}:{r}": n for (k, r), n in
                                                    self.coordinator.decisions_total.items()}}}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.coordinator.link is not None:
            self.coordinator.link.close()
        if self.engine.control is not None:
            self.engine.control.close()
        if os.path.exists(self.control_path):
            os.unlink(self.control_path)


def _control_path(name: str) -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    safe = "".join(c if c.isalnum() else "-" for c in name)
    return os.path.join(base, f"kvloop-w5-{os.getpid()}-{safe}.bin")


def variant_target(name: str, sizing: Sizing, threads: int | None = None, settings=None,
                   cap_max: int | None = None):
    """(target, whether the coordinator's event path is on) for a W5 system name on the real engine.
    settings: the coordinator's base settings (default: the sidecar's defaults)."""
    from kvloop.engine.bench.systems import _checkpoint  # one checkpoint per process, fresh engines
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore

    v = parse_variant(name)
    run_sizing = sized(v, sizing)
    sched, kv = mode_configs(v.mode, run_sizing)
    fb, events = coordinator_settings(v, settings, cap_max)
    control = _control_path(name) if fb is not None else None
    cfg = EngineConfig(kv_cache_tokens=run_sizing.kv_cache_tokens, scheduler=sched, kv=kv, threads=threads,
                       progress=False, control_file=control)
    engine = EngineCore(cfg, checkpoint=_checkpoint())
    if fb is None:
        return EngineTarget(engine, name), False
    return CoordinatedEngineTarget(engine, name, fb, control), events
