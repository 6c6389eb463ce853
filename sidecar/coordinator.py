"""The coordinator: samples the snapshot (the event path looks at every sample), runs the law once a
period, writes targets (enforce), and keeps every decision with its reason and inputs. Single-threaded
core; `run` is the loop around it."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict

from kvloop.engine.control.block import DEFAULT_PATH, ControlBlockError
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.control.records import ControlRecord
from kvloop.sidecar.law import STEERED, ControlLaw, Decision, Observation
from kvloop.sidecar.settings import Settings, SettingsWatcher
from kvloop.sidecar.steering import Steering

log = logging.getLogger("kvloop.sidecar")
RECENT = 200  # decisions kept for /status


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


class Coordinator:
    def __init__(self, watcher: SettingsWatcher, control_path: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.watcher = watcher
        self.control_path = control_path or watcher.settings.control_path or DEFAULT_PATH
        self.clock = clock
        self.steer = Steering(watcher.settings)
        self.link: SidecarLink | None = None
        self.lock = threading.Lock()
        self.recent: deque[dict] = deque(maxlen=RECENT)
        self.decisions_total: Counter[tuple[str, str]] = Counter()
        self.stale_reads = 0
        self.writes = 0
        self.last_decision: dict | None = None  # the last change, else the last decision
        self.last_decision_ts = 0.0
        self.start_id: int | None = None
        self.snapshot: ControlRecord | None = None
        self.control_error: str | None = None  # why the control block cannot be opened (None: it can)
        self.stale = True
        self.period_start = clock()

    @property
    def settings(self) -> Settings:
        return self.watcher.settings

    @property
    def law(self) -> ControlLaw:
        return self.steer.law

    @property
    def last_obs(self) -> Observation | None:
        return self.steer.last_obs

    # ---- sampling -------------------------------------------------------------------------------
    def _open(self) -> SidecarLink | None:
        try:
            if self.link is None:
                self.link = SidecarLink(self.control_path, clock=lambda: int(self.clock() * 1e9))
            else:
                self.link.reopen_if_replaced()
        except ControlBlockError as exc:  # missing (engine not up yet), or another layout version
            if str(exc) != self.control_error:
                log.warning("cannot read the control block: %s", exc)
            self.control_error, self.link = str(exc), None
            return None
        self.control_error = None
        return self.link

    def sample(self) -> ControlRecord | None:
        """Reads one snapshot; returns it when fresh, else counts a stale read and returns None."""
        if self.watcher.poll():
            self.steer.update_settings(self.settings)
        link = self._open()
        snap = link.read_snapshot() if link else None
        if snap is None or snap.age_s > self.settings.snapshot_stale_after:
            self.stale_reads += 1
            self.stale = True
            return None
        self.stale = False
        self.snapshot = snap
        # a new engine start: forget the old state, back to the initial targets
        if snap.start_id != self.start_id:
            first = self.start_id is None
            self.start_id = snap.start_id
            self._record(self.steer.start(snap, first))
            self._write()
            self.period_start = self.clock()
        events = self.steer.sample(snap, self.clock(),
                                   events=self.settings.mode != "off" and self.settings.event_path)
        if events:  # between periods: recorded and written like any other decision
            self._record(events)
            self._write()
        return snap

    # ---- the period -----------------------------------------------------------------------------
    def tick(self) -> list[Decision]:
        """Ends a period: decide, record, write. Holds (and records why) when the snapshot is stale."""
        self.period_start = self.clock()
        if self.settings.mode == "off":
            self.steer.skip()
            return []
        if self.stale:
            self.steer.skip()
            decisions = self.steer.hold("stale_snapshot")
        else:
            decisions = self.steer.tick()
        self._record(decisions)
        self._write()
        return decisions

    def _write(self) -> None:
        """enforce: (re)write the targets every period, so the engine never sees them go stale."""
        if self.settings.mode != "enforce" or self.link is None:
            return
        try:
            # the laws' knobs by name; the speculation cap as the settings fix it (None: no opinion)
            self.link.write_targets(**dict(zip(STEERED, self.law.targets(), strict=True)),
                                    speculation_max_tokens=self.settings.speculation_cap)
            self.writes += 1
        except (OSError, ValueError) as exc:
            log.warning("writing targets failed: %s", exc)

    def _record(self, decisions: list[Decision]) -> None:
        now = self.clock()
        with self.lock:
            for d in decisions:
                entry = {**asdict(d), "at": rfc3339(now), "mode": self.settings.mode,
                         "applied": self.settings.mode == "enforce" and d.changed}
                self.recent.append(entry)
                self.decisions_total[(d.knob, d.reason)] += 1
                if d.changed or self.last_decision is None or not self.last_decision["changed"]:
                    self.last_decision = {**entry, "changed": d.changed}
            self.last_decision_ts = now
        for d in decisions:
            if d.changed:
                log.info("%s %s -> %s (%s)", d.knob, d.old, d.new, d.reason)

    # ---- views ----------------------------------------------------------------------------------
    def status(self, limit: int = 50) -> dict:
        s = self.settings
        with self.lock:
            recent = list(self.recent)[-limit:]
        law = self.law
        return {
            "mode": s.mode, "period_s": s.period_s, "batch_cap": law.batch_cap, "watermark": law.watermark,
            "step_token_budget": law.step_token_budget, "speculation_cap": s.speculation_cap,
            "memory_max_batch_cap": law.memory_max,
            "footprint_blocks": law.footprint_blocks, "converged": law.converged, "stale": self.stale,
            "stale_reads": self.stale_reads, "writes": self.writes, "engine_start_id": self.start_id,
            "settings_error": self.watcher.error, "control_error": self.control_error,
            "last_decision": self.last_decision,
            "snapshot": self.snapshot.as_dict() if self.snapshot else None,
            "observation": asdict(self.last_obs) if self.last_obs else None, "decisions": recent,
        }

    def annotation(self) -> dict:
        """The pod annotation's value (kvloop.io/feedback), without updatedAt."""
        law = self.law
        out = {"batchCap": int(law.batch_cap), "watermark": float(law.watermark),
               "stepTokenBudget": int(law.step_token_budget), "mode": self.settings.mode,
               "converged": law.converged}
        if law.memory_max is not None:
            out["memoryMaxBatchCap"] = int(law.memory_max)
        last = self.last_decision
        if last:
            out["lastDecision"] = {"knob": last["knob"], "old": last["old"], "new": last["new"],
                                   "reason": last["reason"], "trigger": last["trigger"], "at": last["at"],
                                   "inputs": {k: v for k, v in last["inputs"].items() if v is not None}}
        if self.last_obs is not None and self.last_obs.hit_rate is not None:
            out["hitRate"] = round(self.last_obs.hit_rate, 4)  # over the last period
        return out

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None) -> None:
        """Samples every min(1 s, period/4) (the event path's reaction time); decides once a period. on_tick
        runs after every new decision, periodic or not (the annotation publisher)."""
        while not stop.is_set():
            try:
                before = self.last_decision_ts
                self.sample()
                due = self.clock() - self.period_start >= self.settings.period_s
                if due:
                    self.tick()
                if on_tick and (due or self.last_decision_ts != before):
                    on_tick()
            except Exception:  # the loop must outlive any one bad read or write
                log.exception("coordinator iteration failed")
            stop.wait(min(1.0, self.settings.period_s / 4))
