"""The simulator's step loop. It mirrors EngineCore.step/_process on a virtual clock without
torch: schedule with the real Scheduler and KVCacheManager, price the step with SimRunner, advance
the clock, then do EngineCore's bookkeeping (num_computed_tokens, append the sampled token, first
and last token times, finish at max_tokens since outputs ignore EOS). Arrivals and closed-loop
follow-ups come from the workload; the coordinator runs between steps at its virtual period."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.sampling import SamplingParams
from kvloop.engine.scheduler.scheduler import RequestRejected, Scheduler
from kvloop.engine.scheduler.sequence import Sequence
from kvloop.engine.sim.clock import virtual_clock
from kvloop.engine.sim.control import VirtualCoordinator
from kvloop.engine.sim.metrics import RequestRecord, RunMetrics
from kvloop.engine.sim.modes import build_configs
from kvloop.engine.sim.profiles import Profile
from kvloop.engine.sim.runner import SimRunner
from kvloop.engine.sim.workload import RequestSpec, Workload
from kvloop.sidecar.settings import Settings

IDLE_TICK_S = 0.005  # when work waits but nothing can run (a static batch filling), look again after this
_MOVES = ("promotions_host", "swaps_in", "swaps_out", "demotions_host", "promotions_disk")


@dataclass
class SimConfig:
    mode: str = "codesign"
    scheduler: dict = field(default_factory=dict)  # SchedulerConfig fields
    kv: dict = field(default_factory=dict)  # KVConfig fields
    feedback: Settings | None = None  # None: no coordinator (the configured knobs stay)
    sample_every_s: float = 1.0  # KV-use series resolution
    until_s: float | None = None  # stop admitting and stepping at this virtual time
    check_integrity_every: int = 0  # steps; 0: never (tests)


class Simulator:
    def __init__(self, profile: Profile, workload: Workload, config: SimConfig | None = None):
        self.profile, self.workload = profile, workload
        self.config = cfg = config or SimConfig()
        sched_cfg, kv_cfg = build_configs(cfg.mode, cfg.scheduler, cfg.kv)
        bs = profile.block_size
        self.kv = KVCacheManager(profile.kv_pool_tokens // bs, bs, kv_cfg, extra_key=profile.model.name)
        self.scheduler = Scheduler(sched_cfg, self.kv)
        self.runner = SimRunner(profile.cost_model(), bs)
        self.coord = VirtualCoordinator(cfg.feedback) if cfg.feedback is not None else None
        self.metrics = RunMetrics()
        self.now = 0.0
        self.num_steps = 0
        self._specs: dict[str, RequestSpec] = {}
        self._heap: list[tuple[float, int, RequestSpec]] = []
        self._n = 0
        self._next_kv_sample = 0.0
        self._moves = self._move_counts()

    # ---- requests -------------------------------------------------------------------------------
    def _push(self, spec: RequestSpec) -> None:
        heapq.heappush(self._heap, (spec.arrival, self._n, spec))
        self._n += 1

    def _add(self, spec: RequestSpec) -> None:
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
        seq = Sequence(spec.request_id, list(spec.prompt), params, arrival_time=spec.arrival, user=spec.session)
        self.metrics.records[spec.request_id] = RequestRecord(spec.request_id, spec.kind, spec.arrival,
                                                              len(spec.prompt))
        try:
            self.scheduler.add(seq)
        except RequestRejected:
            self.metrics.rejections += 1
            self.metrics.records.pop(spec.request_id)
            return
        self._specs[spec.request_id] = spec

    # ---- engine mirror --------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """EngineCore.snapshot()'s keys, plus the counters a newer scheduler may keep."""
        s, kv = self.scheduler, self.kv
        return {
            "num_waiting": len(s.waiting), "num_running": len(s.running), "batch_cap": s.batch_cap,
            "kv_usage": kv.usage(), "kv_blocks_total": kv.num_blocks, "kv_blocks_free": kv.num_free_blocks,
            "num_preemptions": s.num_preemptions, "num_steps": self.num_steps,
            "num_rejections": self.metrics.rejections + getattr(s, "num_rejections", 0),
            "num_oom_events": self.oom_events, **kv.snapshot(),
        }

    @property
    def oom_events(self) -> int:
        return int(getattr(self.scheduler, "num_oom_events", 0))

    def _move_counts(self) -> tuple[int, int]:
        st = self.kv.stats
        return (st.promotions_host + st.swaps_in + st.swaps_out + st.demotions_host, st.promotions_disk)

    def _process(self, batch, tokens: dict[int, int]) -> None:
        now, rec_of, itl = self.now, self.metrics.records, self.metrics.itl
        for item in batch.items:
            seq = item.seq
            seq.num_computed_tokens = item.start + item.num_tokens
            if not item.samples:
                continue
            seq.token_ids.append(tokens[id(seq)])
            if seq.first_token_time is None:
                seq.first_token_time = now
                rec_of[seq.request_id].first_token = now
                if self.coord is not None:
                    self.coord.record_ttft(now - seq.arrival_time)
            else:
                itl.add(now - seq.last_token_time)
            seq.last_token_time = now
            if seq.num_output_tokens >= seq.params.max_tokens:  # ignore_eos: "length"
                self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq, "length")
        rec = self.metrics.records[seq.request_id]
        rec.finished = rec.last_token = self.now
        rec.output_tokens = seq.num_output_tokens
        rec.cached_tokens = seq.num_cached_tokens
        spec = self._specs.pop(seq.request_id)
        for nxt in self.workload.on_finish(spec, seq.output_token_ids, self.now):
            self._push(nxt)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> dict:
        for spec in self.workload.initial():
            self._push(spec)
        with virtual_clock(lambda: self.now):
            self._loop()
        return self.result()

    def _loop(self) -> None:
        cfg, sched, heap = self.config, self.scheduler, self._heap
        until = cfg.until_s if cfg.until_s is not None else math.inf
        while self.now < until:
            while heap and heap[0][0] <= self.now:
                self._add(heapq.heappop(heap)[2])
            self._observe()
            if not sched.has_work():
                if not heap:
                    break
                self._idle_to(heap[0][0])
                continue
            batch = sched.schedule()
            if not batch:
                self._idle_to(min(heap[0][0] if heap else math.inf, self.now + IDLE_TICK_S))
                continue
            result = self.runner.execute(batch)
            host, disk = self._move_counts()
            moved = self.runner.cost.transfer_seconds(host - self._moves[0], disk - self._moves[1], self.kv.block_size)
            self._moves = (host, disk)
            self.now += self.runner.last.seconds + moved
            self.num_steps += 1
            self._process(batch, result.tokens)
            if cfg.check_integrity_every and self.num_steps % cfg.check_integrity_every == 0:
                sched.check_integrity()

    def _idle_to(self, t: float) -> None:
        """Jumps the clock, stopping at samples and coordinator ticks on the way (state is idle)."""
        while True:
            nxt = min(t, self._next_kv_sample, self.coord.next_event() if self.coord else math.inf)
            self.now = max(self.now, nxt)
            self._observe()
            if self.now >= t:
                return

    def _observe(self) -> None:
        if self.coord is not None:
            self.coord.advance(self.now, self.snapshot, self.scheduler, self.kv)
        while self.now >= self._next_kv_sample:
            self.metrics.kv_series.append((self._next_kv_sample, self.kv.usage(), len(self.scheduler.waiting)))
            self._next_kv_sample += self.config.sample_every_s

    def result(self) -> dict:
        out = self.metrics.summary(self.now, self.kv.stats.as_dict(), self.scheduler.num_preemptions,
                                   self.oom_events)
        out.update(mode=self.config.mode, profile=self.profile.name, model=self.profile.model.name,
                   workload=self.workload.name, kv_pool_tokens=self.profile.kv_pool_tokens,
                   steps=self.num_steps, runner_busy_s=self.runner.busy_s,
                   unfinished=len(self.scheduler.waiting) + len(self.scheduler.running))
        if self.coord is not None:
            out["feedback"] = {"period_s": self.coord.settings.period_s, "ticks": len(self.coord.ticks),
                               "final_batch_cap": self.coord.law.batch_cap,
                               "final_watermark": self.coord.law.watermark,
                               "decisions": [d for d in self.coord.decisions if d["old"] != d["new"]]}
        return out
