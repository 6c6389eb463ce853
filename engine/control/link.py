"""Both ends of the control block: `ControlLink` for the engine, `SidecarLink` for the coordinator.

The engine publishes its snapshot every step and polls the targets; targets are validated (crc,
ranges, version, age) and bad ones are ignored and counted. Targets older than `stale_after_s` give
way to the engine's configured defaults, so the engine outlives its sidecar."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvloop.engine.control import layout as L
from kvloop.engine.control.block import ControlBlock
from kvloop.engine.control.records import (
    UNKNOWN,
    ControlRecord,
    Targets,
    admitted,
    control_record,
    pack_record,
    pack_targets,
    unpack_record,
    unpack_targets,
)

if TYPE_CHECKING:
    from kvloop.engine.core.snapshot import EngineSnapshot

CLOCK_SLACK_NS = 1_000_000_000  # targets stamped this far before the engine started are still taken


def new_id() -> int:
    return secrets.randbits(64) or 1  # 0 reads as "no engine yet"


class ControlLink:
    """Engine side. `defaults` are the engine's configured knob values (engine/core/knobs.py): what stale
    targets fall back to."""

    COUNTERS = ("garbled", "out_of_range", "old_version", "stale", "accepted")

    def __init__(self, path: str | os.PathLike, defaults: Targets, stale_after_s: float = 120.0,
                 clock: Callable[[], int] = time.time_ns):
        self.block = ControlBlock(path, create=True)
        self.defaults = Targets(**defaults.knob_values(), source="default")
        self.stale_after_ns = int(stale_after_s * 1e9)
        self.clock = clock
        self.start_id = new_id()  # new on every start: the sidecar starts over when it changes
        self.start_ns = clock()
        self.steps = 0
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self._seen_seq = -1  # targets record seq already judged
        self._accepted: Targets | None = None
        self._stale = False

    def close(self) -> None:
        self.block.close()

    def publish(self, snapshot: EngineSnapshot, ttft: tuple[float, float] = UNKNOWN,
                tpot: tuple[float, float] = UNKNOWN) -> None:
        """ttft, tpot: (P50, P99) in seconds, NaN while unknown."""
        self.steps += 1
        rec = control_record(snapshot, ttft, tpot, start_id=self.start_id, step=self.steps,
                             time_ns=self.clock())
        self.block.write(L.SNAPSHOT_OFFSET, pack_record(rec))

    def poll_targets(self) -> Targets | None:
        """The targets in force: the sidecar's last valid ones, the defaults once those are stale, or
        None while no valid targets have ever been written (the engine keeps its configuration)."""
        seq = self.block.seq(L.TARGETS_OFFSET)
        if seq != self._seen_seq and seq % 2 == 0:  # a new write: judge it once
            seq, payload = self.block.read(L.TARGETS_OFFSET, L.TARGETS_FMT.size)
            if seq % 2 == 0:
                self._seen_seq = seq
                if payload is None:
                    self.counters["garbled"] += 1
                elif payload:
                    self._judge(unpack_targets(payload))
        if self._accepted is None:
            return None
        if self.clock() - self._accepted.time_ns > self.stale_after_ns:
            if not self._stale:
                self._stale = True
                self.counters["stale"] += 1
            return self.defaults
        return self._accepted

    def _judge(self, t: Targets) -> None:
        now = self.clock()
        if not admitted(t) or t.time_ns > now + self.stale_after_ns:
            self.counters["out_of_range"] += 1
        elif self._accepted is not None and t.version < self._accepted.version:
            self.counters["old_version"] += 1
        elif now - t.time_ns > self.stale_after_ns or t.time_ns < self.start_ns - CLOCK_SLACK_NS:
            self.counters["stale"] += 1  # written too long ago, or for an earlier run of the engine
        else:
            self.counters["accepted"] += 1
            self._accepted, self._stale = t, False


class SidecarLink:
    """Sidecar (and CLI) side: reads the engine's snapshot, writes targets. The file must exist."""

    def __init__(self, path: str | os.PathLike, clock: Callable[[], int] = time.time_ns):
        self.path = path
        self.block = ControlBlock(path)
        self.clock = clock
        self.writer_id = new_id()

    def close(self) -> None:
        self.block.close()

    def reopen_if_replaced(self) -> bool:
        if not self.block.replaced():
            return False
        fresh = ControlBlock(self.path)
        self.block.close()
        self.block = fresh
        return True

    def read_snapshot(self) -> ControlRecord | None:
        """The engine's last snapshot record (with `age_s`), or None when none is readable yet."""
        _, payload = self.block.read(L.SNAPSHOT_OFFSET, L.SNAPSHOT_FMT.size)
        if not payload:
            return None
        rec = unpack_record(payload)
        return replace(rec, age_s=max(0.0, (self.clock() - rec.time_ns) / 1e9))

    def read_targets(self) -> Targets | None:
        _, payload = self.block.read(L.TARGETS_OFFSET, L.TARGETS_FMT.size)
        return unpack_targets(payload) if payload else None

    def write_targets(self, *values: float | None, **by_name: float | None) -> Targets:
        """Writes the knobs' values (in KNOBS order, or by name; None or left out: no opinion) with the next
        version after the one in the file."""
        current = self.read_targets()
        t = Targets(*values, **by_name, version=(current.version if current else 0) + 1, time_ns=self.clock(),
                    writer_id=self.writer_id)
        self.block.write(L.TARGETS_OFFSET, pack_targets(t))
        return t
