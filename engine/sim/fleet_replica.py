"""One replica of a simulated fleet: the single-replica Simulator itself (its scheduler, KV manager, cost
model, fast-forward and recorder, unchanged), fed by the fleet instead of a workload of its own, and run a
stretch at a time on the fleet's clock (`advance`). Requests the router sent it wait in its own arrival heap,
as a single replica's workload does. What differs is only where requests come from and go: follow-up chat
turns go back to the fleet's router; with a shared tier, a request that arrives first reads from the tier
what it holds of its prompt past this replica's own cache (where that pays) and is queued when the read is
done, keeping its time of sending, and prefilled and finished blocks are written to the tier."""

from __future__ import annotations

import heapq
from dataclasses import replace

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
        self._fetched: set[str] = set()  # requests whose shared-tier read is done (or was not worth making)

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
        """Steps to the first boundary at or after `until`, or until it has nothing left to do."""
        self.config.until_s = until
        self._loop()

    def _idle_to(self, t: float) -> None:
        """As the Simulator's, stopping at the stretch's end: a request routed here later may be due before t
        (nothing changes while it idles, so the stop changes nothing else)."""
        until = self.config.until_s
        super()._idle_to(t if until is None else min(t, until))

    def deliver(self, spec: RequestSpec) -> None:
        """A request the router sent here, due at spec.arrival."""
        self._push(spec)

    # ---- hooks on the Simulator's bookkeeping ------------------------------------------------------------
    def arrive_next(self) -> None:
        spec = self._heap[0][2]
        if self.fleet.shared is not None and spec.request_id not in self._fetched:
            self._fetched.add(spec.request_id)
            delay = self.fleet.fetch(self, spec.prompt, self.now)
            if delay > 0:  # queued once the read is done; the client's clock started at its arrival
                heapq.heappop(self._heap)
                self.fleet.sent_at[spec.request_id] = spec.arrival
                self._push(replace(spec, arrival=self.now + delay))
                return
        super().arrive_next()
        self._fetched.discard(spec.request_id)
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
