"""KV counters (tokens for queries and hits, blocks for movements) and the eviction-regret window.

Queries per tier. A lookup asks the tiers top down, each for the prompt tokens the tiers above it did
not serve: the device for every token of the prompt, the host (where it caches prefixes) for those the
device did not serve, the disk (where there is one) for those neither served. "Served" means the hit
lookup_prefix accepted and attached (a match shorter than min_prefix_tokens, or one whose promotion fell
short, serves nothing). So hits_T <= queries_T, hits_T / queries_T is tier T's own hit rate, and the
sum of the hits over query_tokens_device is the overall one. A request is counted once: its queries at its
first lookup, its hits as its last lookup found them (a head of queue waiting for memory is looked up again
every step, and what it finds may change while it waits).

Movements. Blocks enter the device cache at once; under the heat gate those that have not earned their
place (fewer than admit_min_requests distinct requests) are evicted first, and a block is copied to the
host or disk tier only when it is evicted from the device and its hash passes that tier's threshold (for the
host, also only where copies of its class pay: kv.copy_value)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

TIERS = ("device", "host", "disk")


@dataclass
class KVStats:
    query_tokens_device: int = 0  # prompt tokens looked up at admission (the device is asked for all of them)
    query_tokens_host: int = 0  # of those, the ones the device did not serve, asked of the host tier
    query_tokens_disk: int = 0  # the ones neither the device nor the host served, asked of the disk tier
    hit_tokens_device: int = 0
    hit_tokens_host: int = 0
    hit_tokens_disk: int = 0
    # the remote tier (kv.remote_mixin): asked for what no local tier served, where one is configured
    query_tokens_remote: int = 0
    hit_tokens_remote: int = 0
    short_prefix_misses: int = 0  # matches shorter than min_prefix_tokens, treated as misses
    # device blocks evicted before they earned their place (the heat gate's probation class; the name is
    # the metric's, kvloop:cache_admissions_refused, from when the gate refused blocks at release)
    admissions_refused: int = 0
    lower_tier_recomputed: int = 0  # host/disk blocks matched but recomputed: cheaper than loading them
    evictions: int = 0  # device
    host_evictions: int = 0
    disk_evictions: int = 0
    demotions_host: int = 0
    # device-evicted blocks the host did not take: not yet earned their place there, and every host slot held
    # by blocks that have (the host tier's gate under pressure, host_tier.py)
    host_copies_refused: int = 0
    # device-evicted blocks not copied down because copies of their class do not pay (kv.copy_value)
    host_copies_skipped: int = 0
    demotions_disk: int = 0
    promotions_host: int = 0
    promotions_disk: int = 0
    eviction_regret: int = 0
    disk_writes: int = 0
    disk_writes_dropped: int = 0  # write-behind queue full
    disk_bad_files: int = 0  # corrupt, truncated or foreign files: missed and deleted
    swaps_out: int = 0
    swaps_in: int = 0
    # the remote tier: blocks loaded from it (its hits), blocks asked and not served (absent, gone when read,
    # corrupt or foreign), values that failed their checks, blocks written and dropped (queue full or store
    # down), failed calls to the store, bytes over the link, and whether the store answers now (1/0, a gauge)
    promotions_remote: int = 0
    remote_misses: int = 0
    remote_bad_values: int = 0
    remote_writes: int = 0
    remote_writes_dropped: int = 0
    remote_errors: int = 0
    remote_bytes_read: int = 0
    remote_bytes_written: int = 0
    remote_connected: int = 0
    kv_events_dropped: int = 0  # KV events lost to a full buffer (kv/event_log.py; routers then see a clear)

    def hit_tokens(self) -> int:
        return self.hit_tokens_device + self.hit_tokens_host + self.hit_tokens_disk + self.hit_tokens_remote

    def queries(self, tier: str) -> int:
        return getattr(self, f"query_tokens_{tier}")

    def hits(self, tier: str) -> int:
        return getattr(self, f"hit_tokens_{tier}")

    def count_lookup(self, tokens: int, served: Mapping[str, int], tiers: Iterable[str]) -> None:
        """One lookup of `tokens` prompt tokens that asked `tiers` (top down); `served`: tokens per tier."""
        left = tokens
        for tier in tiers:
            setattr(self, f"query_tokens_{tier}", self.queries(tier) + left)
            left -= served.get(tier, 0)

    def count_hits(self, served: Mapping[str, int], replacing: Mapping[str, int]) -> None:
        """Hit tokens per tier of one lookup, replacing what an earlier lookup of the same request counted."""
        for tier in set(served) | set(replacing):
            name = f"hit_tokens_{tier}"
            setattr(self, name, getattr(self, name) + served.get(tier, 0) - replacing.get(tier, 0))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RegretWindow:
    """The last `window` evicted hashes; asking for one of them again counts as regret (once)."""

    def __init__(self, window: int):
        self.window = window
        self._recent: OrderedDict[int, None] = OrderedDict()

    def evicted(self, h: int) -> None:
        self._recent[h] = None
        self._recent.move_to_end(h)
        if len(self._recent) > self.window:
            self._recent.popitem(last=False)

    def asked(self, h: int) -> bool:
        if h not in self._recent:
            return False
        del self._recent[h]
        return True
