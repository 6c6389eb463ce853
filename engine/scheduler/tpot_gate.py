"""Admission held to a TPOT target (pure Python).

A decode row's time per output token is the length of the steps it rides in. The batch cap bounds the rows,
not their cost: on a CPU, 64 rows over 2,000-token contexts make every step (and so every token) several times
slower than 16 rows do, and a 512-token prefill chunk rides in the decode steps it joins. The gate keeps the
measured step time near an operator's TPOT target instead: while the recent steps in which rows decode are
slower than a bar, waiting requests stay waiting (a running row is never preempted for it); rows finish, steps
get shorter, admission resumes. The measurement prices everything a row adds, as run: a row that joins a
cascaded group (codesign) adds little, so more rows fit under the same target than plain rows would.

The bar starts at the target and follows the long-run mean step time (integral correction, within
[BAR_FLOOR x target, target]): every admission brings its prefill chunks into the steps after it, so a bar at
the target alone let W1's TPOT P50 land 10-20% above it in the simulator; with the correction it lands within
a few percent (bench/tpot_target.py: the targets against a sweep of fixed caps).

The engine reports each step's wall time (EngineCore.step), the simulator its virtual time; a lone request is
always admitted (progress), and without a target the gate is always open."""

from __future__ import annotations

RECENT = 0.5  # weight of the newest step in the recent step time (the gate reacts within a step or two)
LONG_RUN = 0.02  # ... in the long-run mean (about the last 50 steps: what a request's TPOT averages over)
GAIN = 0.05  # how fast the bar follows the long-run mean's distance to the target
# the bar never drops below this share of the target (a long prefill-heavy phase cannot wind it
BAR_FLOOR = 0.75
# down to holding everybody)


class TpotGate:
    def __init__(self, target_ms: float | None):
        self.target_s = None if target_ms is None else target_ms / 1000.0
        self.step_s: float | None = None  # recent duration of the steps in which rows decode
        self.mean_s: float | None = None  # their long-run mean
        self.bar_s = self.target_s or 0.0  # admission waits while step_s is above it
        self.holds = 0  # admission attempts it refused (waiting requests held back)

    def observe(self, seconds: float) -> None:
        """One step in which rows decoded took `seconds`."""
        target = self.target_s
        if target is None:
            return
        step, mean = self.step_s, self.mean_s
        self.step_s = seconds if step is None else step + RECENT * (seconds - step)
        self.mean_s = mean = seconds if mean is None else mean + LONG_RUN * (seconds - mean)
        self.bar_s = min(target, max(BAR_FLOOR * target, self.bar_s + GAIN * (target - mean)))

    def open(self, num_running: int) -> bool:
        """Whether waiting requests may be admitted now (counts a refusal)."""
        if self.target_s is None or not num_running or self.step_s is None or self.step_s <= self.bar_s:
            return True
        self.holds += 1
        return False
