"""The engine side of KV events: what the device prefix index stores and drops, buffered for a publisher
thread (pure Python).

`PrefixIndex` calls `stored` / `removed` / `cleared` when its `events` is set (one `if` per add or remove
when it is not). The buffer is a bounded deque, appended to by the engine thread and drained by the
publisher's thread (deque appends and pops are atomic under the GIL: no lock on the step's path). When it
is full, events are dropped and counted, and the next drain ends with an all-cleared event: a router then
forgets this pod's blocks instead of believing a wrong picture (a cache it under-counts costs a miss; one
it over-counts sends requests to a pod that recomputes).

A stored event needs the block's token ids, which the index does not hold: `TokenRecordingHasher` (the
engine's ChainHasher, remembering each key's packed ids beside the key, for the same two generations)
answers them at the moment the block is indexed."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence

from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.kv.hashing import ChainHasher

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
DEFAULT_CAPACITY = 1 << 20  # events (~100 bytes each while buffered): far beyond a step's stores and drops


class TokenRecordingHasher(ChainHasher):
    """ChainHasher that also maps each key it computes back to its block's packed token ids, for as long
    as the key itself is remembered (the current and the previous generation)."""

    def __init__(self, block_size: int, extra: bytes, capacity: int = 1 << 15):
        super().__init__(block_size, extra, capacity)
        self._ids: dict[int, bytes] = {}
        self._old_ids: dict[int, bytes] = {}

    def __setitem__(self, key: tuple[int, bytes], h: int) -> None:
        super().__setitem__(key, h)
        self._ids[h] = key[1]

    def __call__(self, tokens: Sequence[int], num_blocks: int | None = None, parent: int = 0,
                 start: int = 0) -> list[int]:
        if len(self) > self.capacity:  # the base class starts a new generation now: so do the ids
            self._old_ids, self._ids = self._ids, {}
        return super().__call__(tokens, num_blocks, parent, start)

    def packed_ids(self, h: int) -> bytes | None:
        ids = self._ids.get(h)
        return self._old_ids.get(h) if ids is None else ids


def unpack_ids(packed: bytes) -> list[int]:
    """Token ids from hashing's packing (int64, native order)."""
    return array("q", packed).tolist()


class KVEventLog:
    """Index changes in order, as (kind, hash, parent, packed token ids) tuples."""

    def __init__(self, hasher: TokenRecordingHasher | None = None, capacity: int = DEFAULT_CAPACITY):
        self.hasher = hasher
        self.capacity = capacity
        self._queue: deque[tuple] = deque()
        # events lost to a full buffer (each loss also clears the routers' view): the manager's KVStats once
        # attached (kvloop:kv_events_dropped_total), its own until then
        self.stats: KVStats = KVStats()
        self.missing_ids = 0  # stored blocks whose token ids were no longer remembered (not published)
        self._overflowed = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def dropped(self) -> int:
        return self.stats.kv_events_dropped

    def _put(self, event: tuple) -> None:
        if len(self._queue) >= self.capacity:
            self.stats.kv_events_dropped += 1
            self._overflowed = True
            return
        self._queue.append(event)

    def stored(self, h: int, parent: int) -> None:
        ids = self.hasher.packed_ids(h) if self.hasher is not None else None
        if ids is None:
            self.missing_ids += 1
            return
        self._put((STORED, h, parent, ids))

    def removed(self, h: int) -> None:
        self._put((REMOVED, h))

    def cleared(self) -> None:
        self._put((CLEARED,))

    def drain(self) -> list[tuple]:
        """Everything buffered, oldest first (the publisher's thread); an overflow ends it with a clear."""
        out, pop = [], self._queue.popleft
        try:
            while True:
                out.append(pop())
        except IndexError:
            pass
        if self._overflowed:
            self._overflowed = False
            out.append((CLEARED,))
        return out
