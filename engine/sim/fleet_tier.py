"""The fleet's shared remote KV tier, modelled in virtual time (issue 55 part 5): a store every replica writes
the blocks it computed to and reads other replicas' blocks from (a Redis/Valkey, Mooncake store or LMCache
server on the cluster network). Blocks are keyed by the replicas' own chain keys (the same model salts them
alike on every replica), become readable `write_delay_s` after the step that computed them plus the write's
transfer, and leave by the store's own LRU eviction at its capacity.

A read is priced through the load-or-recompute choice the KV manager makes for its host tier
(kv.load_or_recompute.blocks_to_use, with the replica's own fixed prices): a remote block costs its transfer
over the network plus the host -> device copy the manager then makes, a read its round trip once. Blocks
worth reading are fetched into the replica's host tier before the request is queued there (the request
waits for the fetch: its TTFT counts it), where the replica's KV manager finds them and promotes them as it
promotes any host hit (charged at the host link's bandwidth by the simulator's step)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvloop.engine.kv.load_or_recompute import Prices, blocks_to_use, recompute_s

REMOTE = "remote"  # the tier's name in a match's tiers (load_or_recompute prices tiers by name)


@dataclass(frozen=True)
class NetworkLink:
    """The path between a replica and the store. Defaults, stated not measured: an H200 node's scale-out NIC
    is a 400 Gb/s ConnectX-7 per GPU (HGX H200), of which a store's TCP stream reaches about half: 25 GB/s;
    a Redis GET round trip on a datacenter network is ~0.1-0.3 ms; an asynchronous write is batched off the
    step path (the issue's design): 10 ms before it is issued. The store holds 1 TiB (a Valkey node's RAM)."""

    bandwidth_bytes_s: float = 25e9
    latency_s: float = 200e-6
    write_delay_s: float = 10e-3
    capacity_bytes: float = float(2**40)


class SharedTier:
    """Chain keys -> the virtual time they become readable, in LRU order (capacity in blocks)."""

    def __init__(self, link: NetworkLink, block_bytes: int):
        self.link, self.block_bytes = link, block_bytes
        self.capacity = max(1, int(link.capacity_bytes // block_bytes))
        self.ready: OrderedDict[int, float] = OrderedDict()
        self.stats = {"blocks_written": 0, "blocks_read": 0, "reads": 0, "evictions": 0,
                      "reads_declined": 0}

    def transfer_s(self, blocks: int) -> float:
        return blocks * self.block_bytes / self.link.bandwidth_bytes_s

    def write(self, keys: list[int], now: float) -> None:
        """A replica's blocks, computed by `now`: readable after the write delay and their transfer."""
        ready_at = now + self.link.write_delay_s + self.link.latency_s + self.transfer_s(len(keys))
        ready = self.ready
        for h in keys:
            t = ready.get(h)
            if t is None:
                ready[h] = ready_at
                self.stats["blocks_written"] += 1
            else:
                ready.move_to_end(h)  # written again: recent (the store keeps its first copy)
        while len(ready) > self.capacity:
            ready.popitem(last=False)
            self.stats["evictions"] += 1

    def match(self, keys: list[int], start: int, now: float) -> int:
        """How many of keys[start:] lead a run the store can serve at `now`."""
        ready, n = self.ready, 0
        for h in keys[start:]:
            t = ready.get(h)
            if t is None or t > now:
                break
            n += 1
        return n

    def plan(self, local_tiers: tuple[str, ...], keys: list[int], prices: Prices, block_size: int,
             host_block_s: float, now: float) -> int:
        """Blocks past the replica's own match worth reading: the cut load_or_recompute chooses over the
        replica's tiers followed by the store's, kept only if its saving pays the round trip (0: none)."""
        start = len(local_tiers)
        extra = self.match(keys, start, now)
        if not extra or prices.token_s is None:
            return 0
        per_block = self.transfer_s(1) + host_block_s  # over the network, then host -> device
        remote_prices = Prices({**prices.load_block_s, REMOTE: per_block}, prices.token_s, prices.pair_s)
        tiers = (*local_tiers, *([REMOTE] * extra))
        cut = blocks_to_use(tiers, block_size, remote_prices)
        n = cut - start
        if n <= 0:
            return 0
        saving = sum(recompute_s(prices, block_size, i * block_size) - per_block for i in range(start, cut))
        if saving <= self.link.latency_s:
            self.stats["reads_declined"] += 1
            return 0
        return n

    def read(self, keys: list[int]) -> float:
        """Reads these blocks (recent again); the seconds the read takes."""
        for h in keys:
            self.ready.move_to_end(h)
        self.stats["reads"] += 1
        self.stats["blocks_read"] += len(keys)
        return self.link.latency_s + self.transfer_s(len(keys))
