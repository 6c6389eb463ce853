"""The machine's own speed while a run is measured (pure Python): CPU time of two fixed pieces of work.

This VM type's speed drifts by tens of percent within a session (the same 240 s slice of W5 CPU took 263 s of
engine steps at one hour and 226 s an hour later, with no other process running): what the quiet-machine
guard cannot see, since it counts other processes' CPU, not how fast a core runs. A probe times, in the
probing thread's CPU time (so waiting for a busy core adds nothing), hashing 1 MiB (core speed; the hash
releases the GIL) and copying 16 MiB (memory bandwidth; ~1-2 ms under the GIL). Two runs compared side by side
should show the same probe times; a spread within a run says how much its own numbers may have moved."""

from __future__ import annotations

import hashlib
import statistics
import time
from functools import cache


@cache
def _buffers() -> tuple[bytes, bytes]:
    """The hashed 1 MiB and the copied 16 MiB, made at the first probe (not in every
    process that imports this)."""
    return bytes(range(256)) * 4096, bytes(16 << 20)


def probe_ms() -> tuple[float, float]:
    """(compute, memory): thread CPU milliseconds of hashing 1 MiB and of copying 16 MiB."""
    hashed, copied = _buffers()
    t0 = time.thread_time_ns()
    hashlib.sha256(hashed).digest()
    t1 = time.thread_time_ns()
    bytearray(copied)
    t2 = time.thread_time_ns()
    return (t1 - t0) / 1e6, (t2 - t1) / 1e6


def summary(samples: list[tuple[float, float]]) -> dict:
    """Per probe: median, min, max (ms) and the spread max / min - 1; {} without samples."""
    if not samples:
        return {}
    out: dict = {"samples": len(samples)}
    for i, name in enumerate(("compute", "memory")):
        xs = [s[i] for s in samples]
        lo = min(xs)
        out[name] = {"median_ms": statistics.median(xs), "min_ms": lo, "max_ms": max(xs),
                     "spread": max(xs) / lo - 1 if lo > 0 else None}
    return out
