"""Eviction orders over evictable slots (pure Python): GCLOCK and plain LRU behind one base class.

Slots are added when they become evictable (cached, unreferenced) and removed when referenced again.
`victim(can_evict)` picks and removes one slot for which can_evict holds (the caller passes "is a leaf",
so a middle block of a cached chain is never evicted before its descendants). An order picks within any
ring it is handed (`pick`) and says when a slot has run out of credit (`age`), so that kv.two_class can
run it over two classes of slots; `add(slot, earned)` names the class, which a single-class order ignores."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator


class EvictionPolicy(ABC):
    def __init__(self) -> None:
        self._ring: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ring)

    def __contains__(self, slot: int) -> bool:
        return slot in self._ring

    def __iter__(self) -> Iterator[int]:
        return iter(self._ring)

    def add(self, slot: int, earned: bool = True) -> None:
        self._ring[slot] = None
        self._ring.move_to_end(slot)

    def add_all(self, slots: Iterable[int], earned: Iterable[bool]) -> None:
        """add(slot, its earned) for each, in order (a release adds a whole table's cached blocks)."""
        for slot, e in zip(slots, earned, strict=True):
            self.add(slot, e)

    def cool(self, n: int) -> None:
        """n blocks are about to join the earned class: age it (a single-class order has nothing to age)."""
        return

    @property
    def num_earned(self) -> int:
        """Evictable slots that have earned their place (a single-class order: all of them)."""
        return len(self._ring)

    def remove(self, slot: int) -> None:
        self._ring.pop(slot, None)

    @abstractmethod
    def hit(self, slot: int) -> None:
        """A lookup reused this slot's content."""

    def hit_all(self, slots: Iterable[int]) -> None:
        """hit for each of these slots, in order (a prefix hit shares a whole run of blocks)."""
        for slot in slots:
            self.hit(slot)

    def forget(self, slot: int) -> None:
        """The slot's content is gone (evicted or freed): drop any per-slot history."""
        self.remove(slot)

    def victim(self, can_evict: Callable[[int], bool]) -> int | None:
        return self.pick(self._ring, can_evict)

    def victim_unearned(self, can_evict: Callable[[int], bool]) -> int | None:
        """A victim to make room for content that has not earned a place (a single-class
        order ignores the class)."""
        return self.victim(can_evict)

    @abstractmethod
    def pick(self, ring: OrderedDict[int, None], can_evict: Callable[[int], bool]) -> int | None:
        """Removes and returns the first slot of `ring`, in this order, for which can_evict holds."""

    @abstractmethod
    def age(self, slot: int) -> bool:
        """One pass of an aging hand over slot: True when it has no credit left (cold), else spends one."""


class LRU(EvictionPolicy):
    """Least recently released first; no frequency memory (the vLLM-style baseline)."""

    def hit(self, slot: int) -> None:
        pass  # recency is refreshed when the slot is released again (add)

    def hit_all(self, slots: Iterable[int]) -> None:
        pass

    def pick(self, ring: OrderedDict[int, None], can_evict: Callable[[int], bool]) -> int | None:
        for slot in ring:
            if can_evict(slot):
                del ring[slot]
                return slot
        return None

    def age(self, slot: int) -> bool:
        return True  # no frequency credit: reaching the front of its ring is enough


class GClock(EvictionPolicy):
    """Generalized CLOCK: each slot has a small counter, bumped on hit; the hand decrements counters and
    evicts the first evictable slot at zero. The ring is an ordered dict whose front is the hand."""

    def __init__(self, max_count: int = 3):
        super().__init__()
        self.max_count = max_count
        self.counts: dict[int, int] = {}

    def hit(self, slot: int) -> None:
        self.hit_all((slot,))

    def hit_all(self, slots: Iterable[int]) -> None:
        counts, top = self.counts, self.max_count
        for slot in slots:
            count = counts.get(slot, 0)
            counts[slot] = count + 1 if count < top else top  # a count never passes top

    def forget(self, slot: int) -> None:
        self.remove(slot)
        self.counts.pop(slot, None)

    def pick(self, ring: OrderedDict[int, None], can_evict: Callable[[int], bool]) -> int | None:
        # Every slot reaches zero within max_count + 1 turns, so this bound is never the reason for None
        # unless no slot can be evicted at all.
        for _ in range((self.max_count + 2) * len(ring)):
            slot, _ = ring.popitem(last=False)
            count = self.counts.get(slot, 0)
            if count == 0 and can_evict(slot):
                self.counts.pop(slot, None)
                return slot
            self.counts[slot] = max(0, count - 1)
            ring[slot] = None
        return None

    def age(self, slot: int) -> bool:
        count = self.counts.get(slot, 0)
        if count:
            self.counts[slot] = count - 1
        return count == 0


# Eviction orders by the name a cache policy gives (scheduler.policy.CachePolicy.eviction); each factory
# takes the GCLOCK counter ceiling, which only GCLOCK uses.
EVICTION_ORDERS: dict[str, Callable[[int], EvictionPolicy]] = {"lru": lambda _max: LRU(), "gclock": GClock}


def make_policy(name: str, gclock_max: int = 3) -> EvictionPolicy:
    factory = EVICTION_ORDERS.get(name)
    if factory is None:
        raise ValueError(f"unknown eviction policy {name!r}; one of {tuple(EVICTION_ORDERS)}")
    return factory(gclock_max)
