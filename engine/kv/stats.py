"""KV counters (tokens for queries and hits, blocks for movements) and the eviction-regret window."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

TIERS = ("device", "host", "disk")


@dataclass
class KVStats:
    query_tokens: int = 0  # tokens looked up at admission
    hit_tokens_device: int = 0
    hit_tokens_host: int = 0
    hit_tokens_disk: int = 0
    short_prefix_misses: int = 0  # matches shorter than min_prefix_tokens, treated as misses
    admissions_refused: int = 0  # released blocks that failed the device gate
    evictions: int = 0  # device
    host_evictions: int = 0
    disk_evictions: int = 0
    demotions_host: int = 0
    demotions_disk: int = 0
    promotions_host: int = 0
    promotions_disk: int = 0
    eviction_regret: int = 0
    disk_writes: int = 0
    disk_writes_dropped: int = 0  # write-behind queue full
    disk_bad_files: int = 0  # corrupt, truncated or foreign files: missed and deleted
    swaps_out: int = 0
    swaps_in: int = 0

    def hit_tokens(self) -> int:
        return self.hit_tokens_device + self.hit_tokens_host + self.hit_tokens_disk

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
