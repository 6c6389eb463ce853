"""Bounded ghost table: distinct requests per block hash, also for hashes not cached (pure Python).

Each entry keeps at most `max_count` request ids (counting saturates there: the gate only asks "at
least k"), and the table keeps at most `capacity` entries, dropping the least recently touched.
Memory: about 200 bytes per entry (197 measured with tracemalloc on full entries: an int key, a tuple
of at most max_count shared id strings, the ordered-dict node), so the default 65,536 entries stay
near 13 MB."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class GhostTable:
    def __init__(self, capacity: int, max_count: int):
        self.capacity = capacity
        self.max_count = max_count
        self._seen: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def record(self, h: int, request_id: str) -> None:
        self.record_all((h,), request_id)

    def record_all(self, hashes: Iterable[int], request_id: str) -> None:
        """request_id used each of these blocks (one loop: a lookup records a whole prompt's blocks)."""
        seen, capacity, max_count = self._seen, self.capacity, self.max_count
        for h in hashes:
            ids = seen.get(h)
            if ids is None:
                seen[h] = (request_id,)
                if len(seen) > capacity:
                    seen.popitem(last=False)
                continue
            seen.move_to_end(h)
            if len(ids) < max_count and request_id not in ids:  # a hot block's count is full: no id compared
                seen[h] = (*ids, request_id)

    def count(self, h: int) -> int:
        return len(self._seen.get(h, ()))

    def counts(self, hashes: Iterable[int]) -> list[int]:
        """count of each hash, in one pass."""
        get = self._seen.get
        return [len(get(h, ())) for h in hashes]
