"""A fleet in the simulator (issue 55 part 5): N replicas, each the single-replica simulator's real scheduler
and KV manager (fleet_replica.py), on one virtual clock behind a router model (fleet_router.py), with an
optional shared remote KV tier (fleet_tier.py).

The clock: requests arrive at the fleet (the workload's arrivals, and chat turns when the previous turn's
reply ends plus the think time); each is routed when it arrives, from the pods' state then. Before an
arrival at t is routed, every replica with work is stepped to its first step boundary at or after t (the
replica with the earliest clock first), as the single-replica loop takes an arrival at the first boundary
at or after it; a follow-up a replica sends stops that replica at its time. One replica behind any router
runs exactly as the single-replica simulator (tests/sim/test_fleet.py).

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
        self._heap: list[tuple[float, int, RequestSpec, ReplicaSim | None]] = []
        self._n = 0
        self._current: ReplicaSim | None = None  # the replica being stepped
        self.fetched_tokens = 0  # prompt tokens fetched from the shared tier
        self.routed = 0
        self.replica_results: list[dict] = []

    # ---- events ------------------------------------------------------------------------------------------
    def _push(self, t: float, spec: RequestSpec, target: ReplicaSim | None) -> None:
        heapq.heappush(self._heap, (t, self._n, spec, target))
        self._n += 1

    def submit(self, spec: RequestSpec) -> None:
        """A follow-up turn, due at spec.arrival: routed then; the replica that sent it stops by then."""
        self._push(spec.arrival, spec, None)
        if self._current is not None:
            self._current.stop_by(spec.arrival)

    def run(self) -> dict:
        for spec in self.source.initial():
            self._push(spec.arrival, spec, None)
        collecting = gc.isenabled()
        gc.disable()  # as Simulator.run: the loop makes garbage that reference counting frees
        try:
            self._loop()
        finally:
            if collecting:
                gc.enable()
        return self.result()

    def _loop(self) -> None:
        heap, reps = self._heap, self.replicas
        until = self.config.sim.until_s if self.config.sim.until_s is not None else math.inf
        while True:
            t = min(heap[0][0] if heap else math.inf, until)
            behind = [r for r in reps if r.now < t and r.busy()]
            if behind:
                r = min(behind, key=_clock)
                self._current = r
                r.advance(t)
                self._current = None
                continue
            if not heap or heap[0][0] >= until:
                break
            _, _, spec, target = heapq.heappop(heap)
            if target is None:
                self._route(spec, t)
            else:
                target.in_flight -= 1
                target.deliver(spec)

    def _route(self, spec: RequestSpec, now: float) -> None:
        self.routed += 1
        r = self.replicas[self.router.pick(spec.prompt).pod]
        delay = self._fetch(r, spec.prompt, now) if self.shared is not None else 0.0
        if delay > 0:  # queued there once the fetch is done; the client's clock started now
            self.sent_at[spec.request_id] = now
            r.in_flight += 1
            self._push(now + delay, replace(spec, arrival=now + delay), r)
        else:
            r.deliver(spec)

    def _fetch(self, r: ReplicaSim, prompt: list[int], now: float) -> float:
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
