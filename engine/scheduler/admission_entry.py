"""Whether admission looks at the waiting queue at all this step (pure Python): the conditions asked before
any request is weighed. Scheduler.admit() and its loops ask them, and so does the simulator's fast-forward,
which skips steps only where they say that nobody can start."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvloop.engine.scheduler.scheduler import Scheduler


def admission_shut(sched: Scheduler, left: int) -> bool:
    """No waiting request can start this step, whoever waits: static batching (nobody joins a running batch),
    no token budget `left` after the running rows, or the running rows at their ceiling (the batch cap, or
    under grouped admission the cap stretched for rows that join a running group)."""
    return sched.static is not None or left <= 0 or len(sched.running) >= sched.row_ceiling


def admission_tried(sched: Scheduler, left: int) -> bool:
    """admit() weighs the waiting queue this step: someone waits and admission is not shut. The TPOT gate is
    asked after this (it counts its refusals)."""
    return bool(sched.waiting) and not admission_shut(sched, left)
