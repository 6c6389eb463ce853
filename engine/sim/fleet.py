"""A fleet in the simulator (issue 55 part 5): N replicas, each the single-replica simulator's real scheduler
and KV manager (fleet_replica.py), on one virtual clock behind a router model (fleet_router.py), with an
optional shared remote KV tier (fleet_tier.py).

The clock: the router scrapes the pods' metrics every `scrape_s` (the endpoint picker refreshes its pods'
metrics every 50 ms by default), and routes every request that arrives before the next scrape from what it
read then (plus what it sent since) into that replica's arrival heap; then each replica steps to its first
boundary at or after the next scrape, the replica with the earliest clock first. A chat turn that a reply
brings is routed when the reply ends if it is due before the next scrape (a replica stepped ahead of it takes
it at its next boundary: counted as late), else at the scrape before it is due. A replica's heap thus holds
what a single replica's workload would hand it, and one replica behind any router runs exactly as the
single-replica simulator (tests/sim/test_fleet.py).

    python -m kvloop.engine.sim.fleet --replicas 8 --policy prefix_aware --shared-tier --rate 640
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import sys
import time
from dataclasses import dataclass, field, replace

from kvloop.engine.core.slo import Slo
from kvloop.engine.kv.hashing import TupleChainKeys
from kvloop.engine.sim.fleet_replica import FleetFeed, ReplicaSim
from kvloop.engine.sim.fleet_router import POLICIES, Router
from kvloop.engine.sim.fleet_tier import NetworkLink, SharedTier
from kvloop.engine.sim.profiles import Profile
from kvloop.engine.sim.simulator import SimConfig
from kvloop.engine.sim.workload import BenchWorkload, RequestSpec


@dataclass
class FleetConfig:
    replicas: int = 8
    policy: str = "round_robin"
    shared_tier: bool = False
    link: NetworkLink = field(default_factory=NetworkLink)
    sim: SimConfig = field(default_factory=SimConfig)  # each replica's (copied)
    seed: int = 0  # the router's tie-breaks
    # the router's metrics period: the endpoint picker's default refresh (its --refresh-metrics-interval);
    # None: that with several replicas, none with one (no choice to make: it runs as one simulator, unsplit)
    scrape_s: float | None = None


SCRAPE_S = 0.05


class Fleet:
    def __init__(self, profile: Profile, workload, config: FleetConfig):
        """`workload`: a BenchWorkload (or one with its initial()/on_finish())."""
        if config.replicas < 1:
            raise ValueError("a fleet needs at least one replica")
        self.profile, self.config, self.source = profile, config, workload
        bs = profile.block_size
        self.block_size = bs
        self.shared = (SharedTier(config.link, profile.model.kv_bytes_per_token * bs)
                       if config.shared_tier else None)
        self.sent_at: dict[str, float] = {}  # requests that wait for a fetch: when the router got them
        self.replicas: list[ReplicaSim] = []
        for i in range(config.replicas):
            feed = FleetFeed(workload, self.submit)
            self.replicas.append(ReplicaSim(i, profile, feed, replace(config.sim), self))
        self.router = Router(config.policy, self.replicas, config.seed)
        # the replicas' own chain keys (KVCacheManager keys blocks with the model's name as salt)
        self._keys = TupleChainKeys(bs, profile.model.name.encode())
        self._heap: list[tuple[float, int, RequestSpec]] = []  # arrivals not yet routed
        self._n = 0
        self._tick_end = 0.0  # the next scrape: requests due before it are routed now
        self.late = {"count": 0, "max_s": 0.0, "total_s": 0.0}  # follow-ups routed to a replica ahead of them
        self.fetched_tokens = 0  # prompt tokens fetched from the shared tier
        self.routed = 0
        self.replica_results: list[dict] = []

    # ---- events ------------------------------------------------------------------------------------------
    def _push(self, t: float, spec: RequestSpec) -> None:
        heapq.heappush(self._heap, (t, self._n, spec))
        self._n += 1

    def submit(self, spec: RequestSpec) -> None:
        """A follow-up turn, due at spec.arrival: routed now if it is due before the next scrape."""
        if spec.arrival < self._tick_end:
            self._route(spec)
        else:
            self._push(spec.arrival, spec)

    def run(self) -> dict:
        for spec in self.source.initial():
            self._push(spec.arrival, spec)
        collecting = gc.isenabled()
        gc.disable()  # as Simulator.run: the loop makes garbage that reference counting frees
        try:
            self._loop()
        finally:
            if collecting:
                gc.enable()
        return self.result()

    def _loop(self) -> None:
        heap, reps, dt = self._heap, self.replicas, self.config.scrape_s
        if dt is None:
            dt = SCRAPE_S if len(reps) > 1 else math.inf
        until = self.config.sim.until_s if self.config.sim.until_s is not None else math.inf
        tick = 0.0
        while True:
            if not any(r.busy() for r in reps):
                if not heap:
                    break
                if dt < math.inf:  # all idle: on to the next arrival's tick
                    tick = max(tick, math.floor(heap[0][0] / dt) * dt)
            if tick >= until:
                break
            self.router.scrape()
            self._tick_end = end = min(tick + dt, until)
            while heap and heap[0][0] < end:
                self._route(heapq.heappop(heap)[2])
            for r in sorted(reps, key=_clock):
                if r.now < end and r.busy():
                    r.advance(end)
            tick = end

    def _route(self, spec: RequestSpec) -> None:
        self.routed += 1
        r = self.replicas[self.router.pick(spec.prompt).pod]
        if r.now > spec.arrival:  # stepped past it already (a reply's turn, due soon): its next boundary
            late = r.now - spec.arrival
            self.late["count"] += 1
            self.late["total_s"] += late
            self.late["max_s"] = max(self.late["max_s"], late)
        r.deliver(spec)

    def fetch(self, r: ReplicaSim, prompt: list[int], now: float) -> float:
        """Reads into r's host tier the blocks of `prompt` the shared tier holds past r's own match, where
        loading them beats recomputing them; the seconds the read takes (0: nothing read)."""
        kv, bs = r.kv, self.block_size
        host = kv.host
        if host is None or not kv.cache_policy.lower_tiers or not kv.cache_policy.prefix_cache:
            return 0.0  # the replica's KV manager reads no host tier: nowhere to put a remote block
        usable = (len(prompt) - 1) // bs  # never the last token's block (the manager's rule)
        if usable <= 0:
            return 0.0
        keys = self._keys(prompt, usable)
        local = kv.peek_prefix(prompt).tiers
        prices = kv.tier_costs.prices()
        n = self.shared.plan(local, keys, prices, bs, prices.load_block_s.get("host", 0.0), now)
        if n <= 0:
            return 0.0
        start = len(local)
        parent, taken = (keys[start - 1] if start else None), []
        for h in keys[start:start + n]:
            if not host.has(h):
                slot = host.acquire(kv._host_evicted, True)  # the host tier's own eviction makes room
                if slot is None:
                    break
                host.insert(h, slot, parent)
            taken.append(h)
            parent = h
        if not taken:
            return 0.0
        self.fetched_tokens += len(taken) * bs
        return self.shared.read(taken)

    # ---- results -------------------------------------------------------------------------------------------
    def records(self) -> list:
        return [rec for r in self.replicas for rec in r.rec.records.values()]

    def result(self, slo: Slo | None = None) -> dict:
        from kvloop.engine.sim.fleet_report import fleet_summary

        self.replica_results = [r.result() for r in self.replicas]  # each Simulator.result(), as a run's
        return fleet_summary(self, self.replica_results, slo)


def _clock(r: ReplicaSim) -> float:
    return r.now


def run_fleet(profile: Profile, wl, sizing, policy: str, replicas: int, shared_tier: bool,
              mode: str = "codesign", link: NetworkLink | None = None, seed: int = 0,
              until_s: float | None = None) -> dict:
    """One fleet run on a bench Workload `wl` (fresh: chat sessions consume their replies); its result."""
    cfg = FleetConfig(replicas, policy, shared_tier, link or NetworkLink(),
                      SimConfig(mode=mode, sizing=sizing, until_s=until_s,
                                max_model_len=profile.model.context), seed)
    t = time.process_time()
    fleet = Fleet(profile, BenchWorkload(wl), cfg)
    out = fleet.run()
    out["fleet"]["cpu_s"] = time.process_time() - t
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from kvloop.engine.sim.matrix_traces import TRACES

    p = argparse.ArgumentParser(prog="python -m kvloop.engine.sim.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--policy", choices=POLICIES, default="round_robin")
    p.add_argument("--shared-tier", action="store_true", help="the shared remote KV tier")
    p.add_argument("--trace", choices=TRACES, default="W1-gpu")
    p.add_argument("--rate", type=float, required=True, help="requests/s offered to the whole fleet")
    p.add_argument("--window-s", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--mode", default="codesign", help="each replica's mode")
    p.add_argument("--bandwidth-gb-s", type=float, default=NetworkLink.bandwidth_bytes_s / 1e9)
    p.add_argument("--latency-ms", type=float, default=NetworkLink.latency_s * 1e3)
    p.add_argument("--write-delay-ms", type=float, default=NetworkLink.write_delay_s * 1e3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from kvloop.engine.sim.fleet_report import headline
    from kvloop.engine.sim.matrix_traces import PROFILES, TraceOptions, Traces
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.scenarios import sizing_for

    a = parse_args(argv)
    opts = replace(TraceOptions(seed=a.seed), **{{"W1-gpu": "w1_s", "W5-gpu": "w5_s",
                                                  "mooncake": "mooncake_s"}[a.trace]: a.window_s})
    profile = get_profile(PROFILES[a.trace])
    link = NetworkLink(a.bandwidth_gb_s * 1e9, a.latency_ms / 1e3, a.write_delay_ms / 1e3)
    wl = Traces(opts).build(a.trace, a.rate)
    res = run_fleet(profile, wl, sizing_for(profile), a.policy, a.replicas, a.shared_tier, a.mode, link,
                    a.seed)
    print(json.dumps(res, indent=1, default=str) if a.json else json.dumps(headline(res), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
