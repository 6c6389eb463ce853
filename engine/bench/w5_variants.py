"""W5's systems by name (pure Python): a scheduling mode, optionally at a fixed batch cap or steered by the
coordinator, so that one list of names drives the simulator (`kvloop simulate --modes`), the real engine
(bench/w5.py cpu, `kvloop bench --systems`) and the reports.

    continuous+lru                  the mode at the scale's default cap (max_num_seqs)
    codesign@cap64                  coordinator off, batch cap fixed at 64 (the fixed-cap sweep)
    codesign@tpot80                 admission held to an 80 ms TPOT target (SchedulerConfig.tpot_target_ms)
    codesign@cap24@tpot80           both
    codesign@work / @arrival / @slo the scheduler's waiting-queue order (SchedulerConfig.queue_order)
    codesign+coord                  the coordinator with the sidecar's default settings (--feedback default)
    codesign+coord@10s+events       ... with a 10 s period and the event path on (the period sweep)
    codesign+coord:goodput          ... steered by the goodput law (:rules, :bandit; sidecar settings' law)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from kvloop.engine.core.policy import get_policy

# Fixed caps swept through W5's phases (WORKLOADS.md), and the coordinator periods of issue 16.
FIXED_CAPS = {"gpu": (16, 32, 64, 128, 256, 512), "cpu": (4, 8, 16, 32, 64)}
PERIODS = (1.0, 5.0, 10.0, 30.0, 60.0)
# The coordinator's TPOT P50 objective per scale: what steers its step token budget (sidecar.law; without one
# the budget holds the engine's own). GPU: 50 ms, an interactive objective for a 70B model (MLPerf Inference
# v5.0 bounds TPOT at 40 ms in its Llama-2-70B Interactive scenario and at 200 ms in the server one). CPU:
# none, as the sidecar's defaults (the embedded model's TPOT is set by the CPU, not by the chunk size).
TPOT_OBJECTIVE_S: dict[str, float | None] = {"gpu": 0.05, "cpu": None}
# HOOK (issue 16 part 3): a sidecar Settings field that switches the coordinator's event path, if it gets
# one. Without it, the event path is on wherever the control law has one (ControlLaw.event: built in, on in
# every mode but off) and `+events` only names that in the run.
EVENT_PATH_FIELD = "event_path"

_NAME = re.compile(r"^(?P<mode>[\w.+-]+?)(?:@cap(?P<cap>\d+))?(?:@tpot(?P<tpot>\d+(?:\.\d+)?))?"
                   r"(?:@(?P<order>work|arrival|slo))?(?P<coord>\+coord(?::(?P<law>[a-z]+))?(?:@(?P<period>\d+(?:\.\d+)?)s)?"
                   r"(?P<events>\+events)?)?$")


@dataclass(frozen=True)
class Variant:
    mode: str
    cap: int | None = None  # fixed batch cap (coordinator off)
    coordinator: bool = False
    period_s: float | None = None  # None: the settings' period
    events: bool = False  # the coordinator's event path on
    tpot_ms: float | None = None  # the scheduler's TPOT target (admission waits while steps are slower)
    law: str | None = None  # the coordinator's law (sidecar settings' law_kind); None: the settings'
    queue_order: str | None = None  # the scheduler's waiting-queue order; None: its default

    @property
    def name(self) -> str:
        out = self.mode + (f"@cap{self.cap}" if self.cap else "") + (f"@tpot{self.tpot_ms:g}" if self.tpot_ms
                                                                     else "")
        out += f"@{self.queue_order}" if self.queue_order else ""
        if self.coordinator:
            out += ("+coord" + (f":{self.law}" if self.law else "") + (f"@{self.period_s:g}s" if self.period_s
                                                                       else "")
                    + ("+events" if self.events else ""))
        return out


def parse_variant(name: str) -> Variant:
    m = _NAME.match(name.strip())
    if m is None:
        raise ValueError(f"bad system name {name!r} "
                         "(mode[@capN][@tpotMS][@work|@arrival|@slo][+coord[:law][@Ps][+events]])")
    policy = get_policy(m["mode"])  # raises on an unknown mode
    v = Variant(m["mode"], int(m["cap"]) if m["cap"] else None, bool(m["coord"]),
                float(m["period"]) if m["period"] else None, bool(m["events"]),
                float(m["tpot"]) if m["tpot"] else None, m["law"], m["order"])
    if v.coordinator and not policy.feedback_loop:
        raise ValueError(f"{name!r}: the coordinator steers only feedback-loop modes, not {m['mode']!r}")
    if v.law:
        from kvloop.sidecar.settings import LAWS

        if v.law not in LAWS:
            raise ValueError(f"{name!r}: the coordinator's law is one of {LAWS}")
    if v.coordinator and v.cap:
        raise ValueError(f"{name!r}: a fixed cap and the coordinator exclude each other")
    if v.cap is not None and v.cap < 1:
        raise ValueError(f"{name!r}: the cap must be >= 1")
    if v.tpot_ms is not None and v.tpot_ms <= 0:
        raise ValueError(f"{name!r}: the TPOT target must be > 0 ms")
    if v.tpot_ms and policy.static_batching:
        raise ValueError(f"{name!r}: the TPOT target holds admission, and static batching admits none")
    return v


def w5_systems(scale: str, periods: tuple[float, ...] = PERIODS,
               caps: tuple[int, ...] | None = None) -> list[str]:
    """The W5 comparison: continuous+lru, codesign (coordinator off, default cap), codesign with the
    coordinator's defaults, the period sweep with the event path on, the fixed-cap sweep."""
    caps = FIXED_CAPS[scale] if caps is None else caps
    return (["continuous+lru", "codesign", "codesign+coord"]
            + [Variant("codesign", coordinator=True, period_s=p, events=True).name for p in periods]
            + [Variant("codesign", cap=c).name for c in caps])


def event_path_state(settings) -> bool:
    """Whether the coordinator runs with an event path under these settings."""
    if EVENT_PATH_FIELD in {f.name for f in fields(settings)}:
        return bool(getattr(settings, EVENT_PATH_FIELD))
    from kvloop.sidecar.law import ControlLaw

    return hasattr(ControlLaw, "event") and settings.mode != "off"


def with_event_path(settings, on: bool = True):
    """The settings with the event path switched on/off where the settings can switch it (else unchanged)."""
    if EVENT_PATH_FIELD in {f.name for f in fields(settings)}:
        return replace(settings, **{EVENT_PATH_FIELD: on})
    return settings


def tpot_objective(scale: str, given: float | None = None) -> float | None:
    """The coordinator's TPOT objective: `given` (<= 0: none), else the scale's default."""
    if given is None:
        return TPOT_OBJECTIVE_S[scale]
    return given if given > 0 else None


def coordinator_base(scale: str, given: float | None = None):
    """The sidecar's default settings with the scale's TPOT objective (tpot_objective:
    `given` overrides it)."""
    from kvloop.sidecar.settings import Settings

    return Settings(tpot_p50_s=tpot_objective(scale, given))


def coordinator_settings(v: Variant, base=None, cap_max: int | None = None):
    """The coordinator's settings for a variant (None: no coordinator), and whether its event path is on.
    base: the settings to start from (default: the sidecar's defaults, as `--feedback default`);
    cap_max: widen the batch cap's upper bound to it (GPU scale: to the largest fixed cap, so the
    coordinator may go wherever the sweep goes)."""
    if not v.coordinator:
        return None, False
    from kvloop.sidecar.settings import Settings

    s = base if base is not None else Settings()
    if v.period_s:
        s = replace(s, period_s=v.period_s)
    if v.law:
        s = replace(s, law_kind=v.law)
    if cap_max and cap_max > s.batch_cap.max:
        s = replace(s, batch_cap=replace(s.batch_cap, max=cap_max))
    if v.events:
        s = with_event_path(s, True)
    return s, event_path_state(s)


def sized(v: Variant, sizing):
    """The run's sizing: a fixed cap replaces max_num_seqs (the cap the scheduler starts from), a TPOT target
    and a queue order the sizing's."""
    if v.cap:
        sizing = replace(sizing, max_num_seqs=v.cap)
    if v.queue_order:
        sizing = replace(sizing, queue_order=v.queue_order)
    return replace(sizing, tpot_target_ms=v.tpot_ms) if v.tpot_ms else sizing
