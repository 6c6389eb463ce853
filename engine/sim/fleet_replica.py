"""One replica of a simulated fleet: the single-replica Simulator itself (its scheduler, KV manager, cost
model, fast-forward and recorder, unchanged), fed by the fleet instead of a workload of its own, and run a
stretch at a time on the fleet's clock (`advance`). What differs is only where requests come from and go:
follow-up chat turns go back to the fleet's router, finished and prefilled blocks are written to the shared
tier when there is one, and a request that waited for a shared-tier fetch keeps its time of sending."""

from __future__ import annotations

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.scheduler.bookkeeping import Sampled
from kvloop.engine.sim.simulator import SimConfig, Simulator
from kvloop.engine.sim.workload import RequestSpec


class FleetFeed:
    """A replica's workload: nothing at first; follow-ups of its finished turns are handed to the fleet
    (`submit`), which routes each when it arrives."""

    def __init__(self, source, submit):
        self.source, self.submit = source, submit
        self.name = source.name

    def initial(self) -> list[RequestSpec]:
        return []

    def on_finish(self, spec: RequestSpec, output: list[int], now: float) -> list[RequestSpec]:
        for nxt in self.source.on_finish(spec, output, now):
            self.submit(nxt)
        return []


class ReplicaSim(Simulator):
    def __init__(self, index: int, profile, feed: FleetFeed, config: SimConfig, fleet):
        super().__init__(profile, feed, config)
        self.index, self.fleet = index, fleet
        self.in_flight = 0  # routed here, still being fetched from the shared tier

    # ---- what the router reads (a pod's metrics) --------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def kv_usage(self) -> float:
        return self.kv.usage()

    @property
    def kv_blocks(self) -> int:
        return self.kv.num_blocks

    @property
    def batch_cap(self) -> int:
        return self.scheduler.knobs.batch_cap

    @property
    def watermark(self) -> float:
        return self.kv.watermark

    # ---- the fleet's clock ------------------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self._heap) or self.scheduler.has_work()

    def advance(self, until: float) -> None:
        """Steps to the first boundary at or after `until` (earlier where a follow-up it sends is due
        sooner), or until it has nothing left to do."""
        self.config.until_s = until
        self._loop()

    def stop_by(self, t: float) -> None:
        """Something this replica's stretch brought about is due at t: stop there (the loop reads until_s at
        every boundary)."""
        if self.config.until_s is None or t < self.config.until_s:
            self.config.until_s = t

    def deliver(self, spec: RequestSpec) -> None:
        self._push(spec)

    # ---- hooks on the Simulator's bookkeeping ------------------------------------------------------------
    def arrive_next(self) -> None:
        spec = self._heap[0][2]
        super().arrive_next()
        sent = self.fleet.sent_at.pop(spec.request_id, None)
        if sent is not None:  # it waited for a fetch: the client sent it when the router got it
            self.rec.records[spec.request_id].send_s = sent

    def record(self, step: list[Sampled], gaps: dict[float, int] | None = None) -> None:
        tier = self.fleet.shared
        if tier is not None:  # a prompt's blocks are written once its prefill is done (its first token)
            for s in step:
                if s.gap is None and s.error is None:
                    tier.write(self.kv.keys(s.seq), self.now)
        super().record(step, gaps)

    def finished(self, seq: Sequence) -> None:
        tier = self.fleet.shared
        if tier is not None:  # the reply's blocks too (the conversation's next turn starts with them)
            tier.write(self.kv.keys(seq), self.now)
        super().finished(seq)
