"""The simulator's step loop. It mirrors EngineCore.step/_process on a virtual clock without
torch: schedule with the real Scheduler and KVCacheManager, price the step with SimRunner, advance
the clock, then apply it with the scheduler's bookkeeping as EngineCore does (update_from_output:
tokens, times, the finish at max_tokens since outputs ignore EOS) and record it. Arrivals and closed-loop
follow-ups come from the workload as the bench driver sends them; the coordinator runs between
steps at its virtual period; results come out in the benchmark's metrics shape."""

from __future__ import annotations

import gc
import heapq
import math
from dataclasses import dataclass, field, replace

from kvloop.engine.core.batch import ScheduledBatch, StepResult
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.kv.hashing import TupleChainKeys
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.bookkeeping import Sampled
from kvloop.engine.scheduler.scheduler import RequestRejected, Scheduler
from kvloop.engine.scheduler.snapshot import build_snapshot
from kvloop.engine.sim.control import VirtualCoordinator
from kvloop.engine.sim.fastforward import CONTINUE, IDLE, FastForward
from kvloop.engine.sim.modes import Sizing, build_configs
from kvloop.engine.sim.profiles import Profile
from kvloop.engine.sim.results import Recorder
from kvloop.engine.sim.runner import SimRunner
from kvloop.engine.sim.workload import RequestSpec
from kvloop.sidecar.settings import Settings

IDLE_TICK_S = 0.005  # work waits but nothing can run (memory, a static batch filling): look again after this


@dataclass
class SimConfig:
    mode: str = "codesign"
    sizing: Sizing = field(default_factory=Sizing)
    kv: dict = field(default_factory=dict)  # extra KVConfig fields (admission thresholds, watermark, ...)
    feedback: Settings | None = None  # None: no coordinator (the configured knobs stay)
    sample_every_s: float = 1.0  # server snapshots (KV use over time), virtual seconds
    until_s: float | None = None  # stop stepping at this virtual time (unfinished requests are reported)
    check_integrity_every: int = 0  # steps; 0: never (tests)
    fast_forward: bool = True  # steps without schedule()'s per-row calls, steady rows lazily (fastforward.py)
    fast_steps: bool = True  # False: fast-forward only through windows (the others through schedule())
    # longest request (prompt + output): `kvloop simulate` gives the profile model's context
    # (ModelShape.context); None keeps the engine's default (SchedulerConfig), as runs before it had one
    max_model_len: int | None = None


class Simulator:
    def __init__(self, profile: Profile, workload, config: SimConfig | None = None):
        self.profile, self.workload = profile, workload
        self.config = cfg = config or SimConfig()
        sched_cfg, kv_cfg = build_configs(cfg.mode, cfg.sizing, cfg.kv)
        if cfg.max_model_len is not None:
            sched_cfg = replace(sched_cfg, max_model_len=cfg.max_model_len)
        bs = profile.block_size
        # keys from Python's tuple hash (hashing.py): it keeps no files, and blake2b
        # cost up to a fifth of a run
        self.kv = KVCacheManager(cfg.sizing.kv_cache_tokens // bs, bs, kv_cfg, extra_key=profile.model.name,
                                 block_keys=TupleChainKeys)
        cost = profile.cost_model()
        self.kv.tier_costs.fix(cost.tier_prices(bs))  # load or recompute a lower-tier hit: the model's prices
        # one decode step-cost function for the scheduler's choices and the runner's prices
        self.scheduler = Scheduler(sched_cfg, self.kv, clock=lambda: self.now, attention=cost.attention,
                                   layers=profile.model.layers)
        self.runner = SimRunner(cost, bs, self.scheduler.step_cost)
        self.coord = VirtualCoordinator(cfg.feedback) if cfg.feedback is not None else None
        self.rec = Recorder()
        self.now = 0.0
        self.num_steps = 0
        self._specs: dict[str, RequestSpec] = {}
        self._heap: list[tuple[float, int, RequestSpec]] = []
        self._n = 0
        self._next_sample = 0.0
        self._moves = self._move_counts()
        self.fast_forward = FastForward(self, cfg.fast_steps)

    # ---- requests -------------------------------------------------------------------------------
    def _push(self, spec: RequestSpec) -> None:
        heapq.heappush(self._heap, (spec.arrival, self._n, spec))
        self._n += 1

    def arrive_next(self) -> None:
        """The earliest pending request arrives (is sent and queued) now."""
        spec = heapq.heappop(self._heap)[2]
        self.rec.sent(spec)
        self._add(spec)

    def _add(self, spec: RequestSpec) -> None:
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
        seq = Sequence(spec.request_id, list(spec.prompt), params, arrival_time=spec.arrival)
        try:
            self.scheduler.add(seq)
        except RequestRejected as e:
            self.rec.failed(spec.request_id, f"rejected: {e.reason}: {e}", self.now)
            return
        self._specs[spec.request_id] = spec

    # ---- engine mirror --------------------------------------------------------------------------
    def snapshot(self) -> EngineSnapshot:
        """As EngineCore.snapshot() (no model steps fail here)."""
        return build_snapshot(self.scheduler, self.kv, num_steps=self.num_steps)

    def _move_counts(self) -> tuple[int, int]:
        st = self.kv.stats
        return (st.promotions_host + st.swaps_in + st.swaps_out + st.demotions_host, st.promotions_disk)

    def charge_moves(self) -> float:
        """Seconds of tier traffic (swaps, demotions, promotions) since the last call."""
        host, disk = self._move_counts()
        moved = self.runner.cost.transfer_seconds(host - self._moves[0], disk - self._moves[1],
                                                  self.kv.block_size)
        self._moves = (host, disk)
        return moved

    def _process(self, batch: ScheduledBatch, result: StepResult) -> None:
        """The scheduler's bookkeeping (as EngineCore), then the recorder's."""
        self.record(self.scheduler.update_from_output(batch, result, self.now))

    def record(self, step: list[Sampled], gaps: dict[float, int] | None = None) -> None:
        """A step's sampled sequences: first tokens (and the coordinator's TTFT),
        inter-token gaps (counted from
        `step` unless given: the fast step counts those of rows it advanced itself), finishes and the
        follow-ups they bring."""
        now, rec = self.now, self.rec
        count = gaps is None
        gaps = {} if gaps is None else gaps  # inter-token gaps of this step, counted (most share one value)
        for sampled in step:
            seq = sampled.seq
            if sampled.error is not None:  # SimRunner fails nobody; a runner that did would end it so
                rec.failed(seq.request_id, ": ".join(sampled.error), now)
                self._specs.pop(seq.request_id, None)
                continue
            if sampled.gap is None:
                rec.first_token(seq.request_id, now)
                if self.coord is not None:
                    self.coord.record_ttft(now - seq.arrival_time)
            elif count:
                gaps[sampled.gap] = gaps.get(sampled.gap, 0) + 1
            if sampled.finish_reason is not None:
                self.finished(seq)
        for gap, count in gaps.items():
            rec.itl.add(gap, count)

    def _take_failed(self) -> None:
        """As EngineCore: requests the scheduler failed (static mode's out-of-memory) end with an error;
        a failed chat turn ends its session (as the bench driver does)."""
        take = getattr(self.scheduler, "take_failed", None)
        for seq in take() if take else ():
            self.rec.failed(seq.request_id, getattr(seq, "error", None) or "error", self.now)
            self._specs.pop(seq.request_id, None)

    def finished(self, seq: Sequence) -> None:
        """Records a sequence the scheduler finished (outputs ignore EOS: at max_tokens) and sends the
        follow-up it brings (the next chat turn)."""
        self.rec.finished(seq.request_id, self.now, seq.num_output_tokens, seq.num_cached_tokens)
        self.runner.token.forget(seq.request_id)
        if self.coord is not None:  # the coordinator's TPOT, as the engine hook takes it at the finish
            self.coord.record_finish(seq, self.now)
        spec = self._specs.pop(seq.request_id)
        for nxt in self.workload.on_finish(spec, seq.output_token_ids, self.now):
            self._push(nxt)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> dict:
        for spec in self.workload.initial():
            self._push(spec)
        # The loop makes no reference cycles (a test checks), only garbage that reference counting frees: the
        # cyclic collector would only walk the growing heap of records, a third of the time near saturation.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._loop()
        finally:
            if collecting:
                gc.enable()
        return self.result()

    def _loop(self) -> None:
        cfg, sched, heap = self.config, self.scheduler, self._heap
        fast = cfg.fast_forward and not cfg.check_integrity_every
        # until_s read at every boundary: a fleet (fleet.py) lowers it while the loop runs
        while self.now < (cfg.until_s if cfg.until_s is not None else math.inf):
            while heap and heap[0][0] <= self.now:
                self.arrive_next()
            self._observe()
            if not sched.has_work():
                if not heap:
                    break
                self._idle_to(heap[0][0])
                continue
            then = self.fast_forward.run() if fast else None
            if then == CONTINUE:
                continue
            if then == IDLE:  # fast-forward found nothing to run (and admitted nobody)
                batch = None
            else:  # the step only schedule() takes
                batch = sched.schedule()
                self._take_failed()
            if not batch:
                self._idle_to(min(heap[0][0] if heap else math.inf, self.now + IDLE_TICK_S))
                continue
            result = self.runner.execute(batch)
            dt = self.runner.last.seconds + self.charge_moves()
            self.now += dt
            sched.observe_step(dt, bool(batch.decodes))
            self.num_steps += 1
            self._process(batch, result)
            if cfg.check_integrity_every and self.num_steps % cfg.check_integrity_every == 0:
                sched.check_integrity()

    def _deadline(self, arrivals: bool = True) -> float:
        """The next time something besides stepping happens (an arrival, a sample, a tick, the end)."""
        t = min(self._heap[0][0] if self._heap and arrivals else math.inf, self._next_sample,
                self.coord.next_event() if self.coord else math.inf)
        return min(t, self.config.until_s) if self.config.until_s is not None else t

    def _idle_to(self, t: float) -> None:
        """Jumps the clock, stopping at samples and coordinator ticks on the way (state is idle)."""
        while True:
            self.now = max(self.now,
                           min(t, self._next_sample, self.coord.next_event() if self.coord else math.inf))
            self._observe()
            if self.now >= t:
                return

    def _observe(self) -> None:
        if self.coord is not None:
            self.coord.advance(self.now, self.snapshot, self.scheduler, self.kv)
        if self.now >= self._next_sample:
            self.rec.sample(self.now, self.snapshot())
            while self._next_sample <= self.now:
                self._next_sample += self.config.sample_every_s

    def result(self) -> dict:
        self.rec.sample(self.now, self.snapshot())
        out = self.rec.summary(self.now)
        sizing = self.config.sizing
        out["sim"] = {
            "mode": self.config.mode, "profile": self.profile.name, "model": self.profile.model.name,
            "hardware": self.profile.hw.name, "steps": self.num_steps, "virtual_s": self.now,
            "runner_busy_s": self.runner.busy_s,
            "static_batches": len(self.scheduler.static.batches) if getattr(self.scheduler, "static",
                                                                            None) else None,
            "unfinished": len(self.scheduler.waiting) + len(self.scheduler.running),
            "sizing": sizing.__dict__, "cost": self.profile.eff.__dict__,
        }
        if self.coord is not None:
            out["feedback"] = {"period_s": self.coord.settings.period_s, "ticks": len(self.coord.ticks),
                               "final_batch_cap": self.coord.law.batch_cap,
                               "final_watermark": self.coord.law.watermark,
                               "changes": [d for d in self.coord.decisions if d["old"] != d["new"]]}
        return out
