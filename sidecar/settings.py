"""Coordinator settings: the mounted YAML/JSON file (the operator renders it as sidecar.yaml).

Shape (every key optional)::

    mode: enforce            # off | observe | enforce
    period_s: 30
    stale_after_s: 120       # the engine's staleness limit for targets (the sidecar refreshes well before)
    snapshot_stale_s: 60     # a snapshot older than this makes the coordinator hold (default 2 periods, >= 5
    s) event_path: true         # react between periods (first request, preemption bursts, surging queues)
    batch_cap: {min: 1, max: 64, max_step: 8, initial: 32}
    watermark: {min: 0.0, max: 0.9, max_step: 0.1, initial: 0.3}     # no initial: the engine's own value
    step_token_budget: {min: 64, max: 8192, max_step: 256, initial: 512}   # no initial: the engine's own
    targets: {ttft_p99_s: 2.0, max_queue_depth: 16, tpot_p50_s: 0.1}       # default: no objectives
    law: {kv_band_low: 0.85, kv_band_high: 0.95, cut_factor: 0.75, raise_fraction: 0.25,
          hit_good: 0.5, light_kv: 0.5, hysteresis_periods: 2, converged_periods: 3,
          footprint_shift: 0.25, tpot_headroom: 0.8, event_preemptions: 3, event_queue_growth: 0.5,
          event_cooldown_s: 10, preemption_share: 0.1}
    speculation_cap: 2       # write this speculation cap with every targets write; default: no opinion
    control: {path: /run/kvloop/control.bin}
    annotation: {enabled: true, key: kvloop.io/feedback, heartbeat_s: 60}
    law: goodput             # rules (default) | goodput | bandit; or law: {kind: goodput, kv_band_low: ...}
    trial: {window_periods: 3, settle_periods: 1, margin: 0.02, noise_z: 1.0, min_judged: 20, min_proxy: 3,
            proxy_margin: 0.02, cap_step: 1.25, watermark_step: 0.1, budget_step: 2.0, rest_periods: 10,
            max_wait_periods: 12}
    bandit: {cap_factors: [0.75, 1.0, 1.25], budget_factors: [0.25, 0.5, 1.0, 2.0], watermark_offsets: [0.0],
             explore: 0.5, arm_periods: 2, min_judged: 5, seed: 0}

Which law steers (`law`, `kvloop sidecar --law`): `rules` (sidecar.law: AIMD cap, watermark rules,
TPOT-steered budget), `goodput` (sidecar.goodput: trials of one knob step each, kept when the SLO goodput
rose, rolled back when not; `trial` sets them) or `bandit` (sidecar.bandit: a contextual bandit over a grid
of knob settings, keyed by the load regime; `bandit` sets it). All three start at the same memory-derived
values and keep the same safety rules. The bounds of every `trial` and `bandit` value are in TRIAL_LIMITS
and BANDIT_LIMITS.

The batch cap's `initial` holds only until the first request is seen: then the cap is placed at the
memory-derived maximum (sidecar.law). Without one, the cap starts from the pool and the engine's max
context, else the engine's own cap. `max_step` bounds every raise; cuts are multiplicative and placements
at the memory-derived maximum (the first request, a shift in the footprint) are not steps. Raises go past
that estimate while the pool's measured KV use is below kv_band_low; preemptions up to preemption_share of
the requests finished in a period hold the cap, more cut it.
The step token budget never goes above the engine's configured budget (the scheduler's ceiling); without a
`max` of its own that is its only upper bound.
No law steers the speculation cap (engine/core/knobs.py SPECULATION_MAX_TOKENS): `speculation_cap` (`kvloop
sidecar --speculation-cap`) is a fixed cap the coordinator writes with every targets write, in [0, 64] (0
turns speculation off; the engine never raises it past its --speculation-max-tokens); unset, the targets
carry no opinion and the engine keeps its own.
Defaults (mode, period, staleness, bounds, objectives) come from the table in engine/core/defaults.py, which
the operator's InferenceService defaults read too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from kvloop.engine.core import defaults as D
from kvloop.engine.core.knobs import SPECULATION_MAX_TOKENS

MODES = ("off", "observe", "enforce")


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Bounds:
    min: float
    max: float
    max_step: float
    initial: float | None  # None: take the engine's own value from its first snapshot

    def clamp(self, value: float) -> float:
        return min(self.max, max(self.min, value))


@dataclass(frozen=True)
class LawParams:
    kv_band_low: float = 0.85  # raise the cap only below this KV use
    kv_band_high: float = 0.95  # cut the cap above it
    cut_factor: float = 0.75  # multiplicative decrease on pressure
    # preemptions up to this share of the requests finished in a period stop the cap's raises, do not cut it
    preemption_share: float = 0.1
    raise_fraction: float = 0.25  # additive increase: this share of the cap (at least 1, at most max_step)
    hit_good: float = 0.5  # hit rate that makes protecting cached prefixes worth it
    light_kv: float = 0.5  # below this KV use with nothing queued, load is light
    cap_binding: float = 0.9  # the cap binds when running >= this share of it
    hysteresis_periods: int = 2  # periods a raise waits after a cut (watermark: a raise condition must hold)
    converged_periods: int = 3  # periods without a change that count as converged
    # the memory-derived maximum moved up this share: the traffic changed, re-place
    footprint_shift: float = 0.25
    tpot_headroom: float = 0.8  # TPOT P50 below this share of its objective: room to raise the step budget
    # After a step budget change its TPOT rules wait this long: the TPOT P50 the engine
    # publishes covers its last
    # 256 finished requests, each over its whole decode, so it shows a change tens of seconds late; a loop
    # faster than that acts on TPOTs from before its own change and swings the budget from bound to bound.
    budget_settle_s: float = 30.0
    event_preemptions: int = 3  # preemptions between two samples that make a burst (the event path cuts)
    # queue growth between two samples, as a share of the cap, that is a surge
    event_queue_growth: float = 0.5
    event_cooldown_s: float = 10.0  # at most one event decision this often


LAWS = ("rules", "goodput", "bandit")


@dataclass(frozen=True)
class TrialParams:
    """The goodput law's trials (sidecar.goodput); bounds in TRIAL_LIMITS."""

    window_periods: int = 3  # periods one window of judgement spans (the baseline and the trial alike)
    # periods after a move that no window counts: the requests finishing then were admitted before it
    settle_periods: int = 1
    margin: float = 0.02  # keep a trial when the goodput share rose by more than this (absolute)...
    noise_z: float = 1.0  # ... and by more than this many standard errors of the difference (0: none)
    min_judged: int = 20  # requests judged in each window to compare goodput shares; fewer: the proxy
    min_proxy: int = 3  # requests with a first token in each window for the proxy (mean slack); fewer: hold
    proxy_margin: float = 0.02  # keep a trial judged on the proxy when the mean slack rose by more than this
    cap_step: float = 1.25  # a cap trial multiplies or divides the cap by this (at least one request)
    watermark_step: float = 0.1  # a watermark trial adds or takes this
    budget_step: float = 2.0  # a step budget trial multiplies or divides the budget by this
    rest_periods: int = 10  # after a round of trials with none kept, periods before the next round
    max_wait_periods: int = 12  # a trial waits this long for traffic enough to judge it, then rolls back


TRIAL_LIMITS = {"window_periods": (1, 20), "settle_periods": (0, 10), "margin": (0.0, 0.5),
                "noise_z": (0.0, 5.0), "min_judged": (1, 100_000), "min_proxy": (1, 100_000),
                "proxy_margin": (0.0, 1.0), "cap_step": (1.01, 4.0), "watermark_step": (0.01, 0.5),
                "budget_step": (1.01, 8.0), "rest_periods": (0, 1000), "max_wait_periods": (1, 1000)}


@dataclass(frozen=True)
class BanditParams:
    """The bandit law's arms and exploration (sidecar.bandit); bounds in BANDIT_LIMITS."""

    cap_factors: tuple[float, ...] = (0.75, 1.0, 1.25)  # times the memory-derived cap
    budget_factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)  # times the step budget at the engine's start
    watermark_offsets: tuple[float, ...] = (0.0,)  # added to the watermark at the engine's start
    explore: float = 0.5  # UCB's exploration weight (rewards lie in [0, 1])
    arm_periods: int = 2  # periods an arm plays: the first settles, the rest are rewarded
    min_judged: int = 5  # requests judged in a period to reward it with the goodput share; fewer: the proxy
    seed: int = 0  # orders the untried arms and breaks ties


BANDIT_LIMITS = {"cap_factors": (0.1, 4.0), "budget_factors": (0.05, 8.0), "watermark_offsets": (-0.9, 0.9),
                 "explore": (0.0, 10.0), "arm_periods": (1, 20), "min_judged": (1, 100_000),
                 "seed": (0, 2**32 - 1)}


def _params(cls, raw, limits: dict, name: str):
    """A params dataclass from a mapping: known keys only, each converted to its default's type and checked
    against its bounds (tuples: every element, and at least one)."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{name} must be a mapping")
    default = cls()
    unknown = set(raw) - {f.name for f in fields(cls)}
    if unknown:
        raise SettingsError(f"{name}: unknown keys {sorted(unknown)}")
    values = {}
    for key, value in raw.items():
        kind = type(getattr(default, key))
        lo, hi = limits[key]
        items = tuple(float(v) for v in value) if kind is tuple else (kind(value),)
        if not items or not all(lo <= v <= hi for v in items):
            raise SettingsError(f"{name}.{key} must lie in [{lo}, {hi}]")
        values[key] = items if kind is tuple else items[0]
    return cls(**values)


def _default_bounds(d: D.Default, integer: bool) -> Bounds:
    conv = int if integer else float
    return Bounds(conv(d.value.min), conv(d.value.max), conv(d.value.max_step), None)


@dataclass(frozen=True)
class Settings:
    mode: str = D.FEEDBACK_MODE.value
    period_s: float = D.FEEDBACK_PERIOD_S.value
    stale_after_s: float = D.CONTROL_STALE_AFTER_S.value
    snapshot_stale_s: float | None = None
    batch_cap: Bounds = _default_bounds(D.FEEDBACK_BATCH_CAP, integer=True)
    watermark: Bounds = _default_bounds(D.FEEDBACK_WATERMARK, integer=False)
    step_token_budget: Bounds = _default_bounds(D.FEEDBACK_STEP_TOKEN_BUDGET, integer=True)
    ttft_p99_s: float | None = D.FEEDBACK_TTFT_P99_S.value
    # the step budget's objective; None: the budget holds the engine's
    tpot_p50_s: float | None = D.FEEDBACK_TPOT_P50_S.value
    max_queue_depth: int = D.FEEDBACK_MAX_QUEUE_DEPTH.value
    law: LawParams = field(default_factory=LawParams)
    # which law steers (LAWS); the settings file's `law` key names it. goodput: on live servers (AVX2 AMD,
    # bench/results/matrix_cpu.json) it met 32 of issue 57's 34 goals against the rules law's 28: on W1 at
    # continuous+lru's capacity 1.05x its goodput where the rules law's cap raises cost 0.70x (65 TPOT misses
    # against 16); in the H200 simulator (matrix_h200.json) at least the rules law's goodput in every cell
    law_kind: str = "goodput"
    trial: TrialParams = field(default_factory=TrialParams)
    bandit: BanditParams = field(default_factory=BanditParams)
    event_path: bool = True  # decisions between periods (sidecar.law: ControlLaw.event)
    speculation_cap: int | None = None  # written as is with every targets write; None: no opinion
    control_path: str | None = None
    annotation_enabled: bool = True
    annotation_key: str = "kvloop.io/feedback"
    heartbeat_s: float = 60.0

    @property
    def snapshot_stale_after(self) -> float:
        return self.snapshot_stale_s if self.snapshot_stale_s else max(5.0, 2.0 * self.period_s)


def _bounds(raw: dict, default: Bounds, integer: bool, name: str) -> Bounds:
    conv = int if integer else float
    b = Bounds(*(conv(raw.get(k, getattr(default, k))) for k in ("min", "max", "max_step")),
               initial=None if raw.get("initial") is None else conv(raw["initial"]))
    if not b.min <= b.max or b.max_step <= 0:
        raise SettingsError(f"bad {name} bounds {b}")
    if integer and b.min < 1:
        raise SettingsError(f"{name}.min must be >= 1")
    if not integer and not 0.0 <= b.min <= b.max < 1.0:
        raise SettingsError(f"{name} bounds must lie in [0, 1)")
    return b if b.initial is None else replace(b, initial=b.clamp(b.initial))


def parse_speculation_cap(value) -> int | None:
    """The settings' fixed speculation cap: None (no opinion), or an integer within the knob's range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not SPECULATION_MAX_TOKENS.admits(value):
        raise SettingsError(f"speculation_cap must be an integer in {SPECULATION_MAX_TOKENS.bounds()}, "
                            f"got {value!r}")
    return value


def parse_settings(raw: dict | None) -> Settings:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SettingsError("settings must be a mapping")
    d = Settings()
    mode = str(raw.get("mode", d.mode))
    if mode not in MODES:
        raise SettingsError(f"mode must be one of {MODES}")
    targets = raw.get("targets") or {}
    ann = raw.get("annotation") or {}
    law_raw = raw.get("law") or {}
    if isinstance(law_raw, str):  # law: goodput
        law_raw = {"kind": law_raw}
    law_raw = dict(law_raw)
    law_kind = str(law_raw.pop("kind", d.law_kind))
    if law_kind not in LAWS:
        raise SettingsError(f"law must be one of {LAWS}")
    law = LawParams(**{f.name: type(getattr(d.law, f.name))(law_raw[f.name])
                       for f in fields(LawParams) if f.name in law_raw})
    if not 0 < law.kv_band_low <= law.kv_band_high <= 1 or not 0 < law.cut_factor < 1:
        raise SettingsError("law: need 0 < kv_band_low <= kv_band_high <= 1 and 0 < cut_factor < 1")
    if (not 0 < law.tpot_headroom <= 1 or law.footprint_shift <= 0 or law.event_cooldown_s < 0
            or law.budget_settle_s < 0 or law.preemption_share < 0):
        raise SettingsError("law: need 0 < tpot_headroom <= 1, footprint_shift > 0, event_cooldown_s >= 0, "
                            "budget_settle_s >= 0 and preemption_share >= 0")
    period = float(raw.get("period_s", d.period_s))
    if period <= 0:
        raise SettingsError("period_s must be > 0")
    ttft, tpot = targets.get("ttft_p99_s"), targets.get("tpot_p50_s")
    return Settings(
        mode=mode, period_s=period, stale_after_s=float(raw.get("stale_after_s", d.stale_after_s)),
        snapshot_stale_s=float(raw["snapshot_stale_s"]) if raw.get("snapshot_stale_s") else None,
        batch_cap=_bounds(raw.get("batch_cap") or {}, d.batch_cap, integer=True, name="batch_cap"),
        watermark=_bounds(raw.get("watermark") or {}, d.watermark, integer=False, name="watermark"),
        step_token_budget=_bounds(raw.get("step_token_budget") or {}, d.step_token_budget, integer=True,
                                  name="step_token_budget"),
        ttft_p99_s=float(ttft) if ttft else None,
        tpot_p50_s=float(tpot) if tpot else None,
        max_queue_depth=int(targets.get("max_queue_depth") or 0),
        law=law,
        law_kind=law_kind,
        trial=_params(TrialParams, raw.get("trial") or {}, TRIAL_LIMITS, "trial"),
        bandit=_params(BanditParams, raw.get("bandit") or {}, BANDIT_LIMITS, "bandit"),
        event_path=bool(raw.get("event_path", d.event_path)),
        speculation_cap=parse_speculation_cap(raw.get("speculation_cap")),
        control_path=(raw.get("control") or {}).get("path"),
        annotation_enabled=bool(ann.get("enabled", d.annotation_enabled)),
        annotation_key=str(ann.get("key", d.annotation_key)),
        heartbeat_s=float(ann.get("heartbeat_s", d.heartbeat_s)),
    )


def load_settings(path: str | os.PathLike | None) -> Settings:
    if path is None:
        return Settings()
    text = Path(path).read_text()
    try:
        raw = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsError(f"{path}: {exc}") from exc
    return parse_settings(raw)


class SettingsWatcher:
    """Reloads the file when it changes. A kubelet ConfigMap update swaps a symlink, so the check
    looks at the resolved file's identity and mtime, not only the path's. A bad file keeps the old
    settings (and records the error)."""

    def __init__(self, path: str | os.PathLike | None, overrides: dict | None = None):
        self.path = path
        self.overrides = overrides or {}
        self.error: str | None = None
        self._stamp = self._stat()
        self.settings = self._apply(load_settings(path))

    def _stat(self):
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            return (os.path.realpath(self.path), st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return None

    def _apply(self, s: Settings) -> Settings:
        return replace(s, **self.overrides) if self.overrides else s

    def poll(self) -> bool:
        """True when new settings were loaded."""
        stamp = self._stat()
        if stamp == self._stamp or stamp is None:
            return False
        self._stamp = stamp
        try:
            new = self._apply(load_settings(self.path))
        except (OSError, SettingsError, TypeError, ValueError) as exc:
            self.error = str(exc)
            return False
        self.error = None
        changed = new != self.settings
        self.settings = new
        return changed
