"""Host tier bookkeeping: a bounded set of CPU block slots (pure Python; the mover holds the tensor).

A slot is free, pinned (held by swapped-out sequences; may also be indexed) or cached (indexed,
unpinned, evictable). Cached slots are evicted by the same policy classes as the device pool.

With a two-class policy (kv.two_class) the heat gate applies here as on the device, under pressure only: a
block that has not earned its place (`earned(hash)` false) is copied in while a slot is free or another such
block can make room, and such blocks leave first; a block that has earned it may push out any cached slot. So
one-off prompts churn among themselves and cannot flush hot documents, while a tier with
room still takes every block
(a gate in front of free room only loses: the next request for that document would recompute it). Each hit
moves the protected class's aging hand one slot (after the lookup's promotions), so a copy nobody asks for any
more cools back to probation."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kvloop.engine.kv.eviction import EvictionPolicy


def _always(h: int) -> bool:
    return True


class HostTier:
    def __init__(self, num_slots: int, policy: EvictionPolicy, earned: Callable[[int], bool] = _always):
        self.num_slots = num_slots
        self.policy = policy
        # hash -> whether it keeps its place under pressure (a single-class order ignores it)
        self.earned = earned
        self._free: deque[int] = deque(range(num_slots))
        self.pins = [0] * num_slots
        self._slot_of: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._parent: dict[int, int | None] = {}  # hash -> its parent's hash (None: unknown)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def has(self, h: int) -> bool:
        return h in self._slot_of

    def slot_of(self, h: int) -> int | None:
        return self._slot_of.get(h)

    def hash_of(self, slot: int) -> int | None:
        return self._hash_of.get(slot)

    def acquire(self, on_evict: Callable[[int, int], None], earned: bool = True) -> int | None:
        """A slot for new content, evicting a cached one if needed (on_evict(slot, hash) runs first,
        while the slot still holds the old content). The slot comes back unpinned and unindexed. Content
        that has not earned its place may only take a free slot or push out other such content (None else)."""
        if self._free:
            return self._free.popleft()
        slot = self.policy.victim(_always) if earned else self.policy.victim_unearned(_always)
        if slot is None:
            return None
        h = self._hash_of.pop(slot)
        del self._slot_of[h]
        self._parent.pop(h, None)
        self.policy.forget(slot)
        on_evict(slot, h)
        return slot

    def insert(self, h: int, slot: int, parent: int | None = None) -> None:
        """Indexes a slot acquired for hash h; unpinned slots become evictable. The parent hash lets a
        flush to disk go in prefix order."""
        self._slot_of[h] = slot
        self._hash_of[slot] = h
        self._parent[h] = parent
        earned = self.earned(h)
        if earned:
            # the offers that earned it count as one use: it survives one sweep of the hand
            self.policy.hit(slot)
        if self.pins[slot] == 0:
            self.policy.add(slot, earned)

    def entries(self) -> dict[int, tuple[int, int | None]]:
        """hash -> (slot, parent hash) of every indexed slot."""
        return {h: (slot, self._parent.get(h)) for h, slot in self._slot_of.items()}

    def hit(self, slot: int) -> None:
        self.policy.hit(slot)
        self.refresh(slot)

    def cool(self, hits: int) -> None:
        """Uses of the tier age its protected class (two_class.py), one slot per hit: copies nobody asks for
        cool. Called once a lookup's promotions are done, not per hit: a chain promoted block by block would
        otherwise cool its own later blocks, which the same promotion's evictions could then displace."""
        self.policy.cool(hits)

    def refresh(self, slot: int) -> None:
        """An evictable slot moves to the recent end of its order (LRU; harmless for GCLOCK), in its class as
        of now (its hash may have earned its place since it came in)."""
        if slot in self.policy:
            self.policy.add(slot, self.earned(self._hash_of[slot]))

    def pin(self, slot: int) -> None:
        if self.pins[slot] == 0:
            self.policy.remove(slot)
        self.pins[slot] += 1

    def unpin(self, slot: int) -> None:
        self.pins[slot] -= 1
        assert self.pins[slot] >= 0
        if self.pins[slot]:
            return
        h = self._hash_of.get(slot)
        if h is not None:
            self.policy.add(slot, self.earned(h))
        else:
            self._free.append(slot)

    def check(self, expected_pins: list[int]) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a host slot is free twice"
        assert self.pins == expected_pins, "host pin counts differ from the swapped sequences"
        for slot in range(self.num_slots):
            states = (slot in free) + (self.pins[slot] > 0) + (slot in self.policy)
            assert states == 1, f"host slot {slot} is in {states} states"
            if slot in self.policy:
                assert slot in self._hash_of, "a cached host slot is not indexed"
            if slot in free:
                assert slot not in self._hash_of, "a free host slot is indexed"
        assert all(self._hash_of[s] == h for h, s in self._slot_of.items())
        assert len(self._slot_of) == len(self._hash_of)
