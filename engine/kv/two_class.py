"""Two classes of evictable device blocks over one eviction order (pure Python; SLRU/2Q-like).

The heat gate's rule (a block earns its place once `admit_min_requests` distinct requests used it) decides
who leaves first under pressure, never who may enter: every released full block is evictable at once.
- *probation*: blocks that have not earned their place. Evicted first, so one-off prompts churn among
  themselves and cannot flush hot documents.
- *protected*: blocks that have. Evicted only when no probation block can go (leaves first in each class).
Within each class the wrapped order (GCLOCK) decides. A protected block that stops being used cools: the
caller calls `cool(n)` before n blocks (of one release) join the protected class, which moves an aging
hand n slots over the protected ring (at most once round, and never over the joining blocks themselves),
spending each slot's credit (its GCLOCK count); a slot with none left moves back to probation, where it is
evicted before any protected block and no longer held by the retention watermark. So a prefix stays
protected while requests keep using it and is let go once protected traffic has swept the ring
(max_count + 1) times without it. The hand moves with protected traffic only, as 2Q ages its main queue
by its own references: however many one-off blocks churn through probation, they cannot cool a hot
prefix.

The class is the caller's verdict at `add(slot, earned)`: a block is reclassified each time it becomes
evictable again (its ghost count may have grown while it was in use)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from kvloop.engine.kv.eviction import EvictionPolicy


class TwoClass(EvictionPolicy):
    def __init__(self, order: EvictionPolicy):
        super().__init__()  # self._ring: the protected class
        self.order = order  # per-slot history (GCLOCK counts) and the order within a ring
        self._probation: OrderedDict[int, None] = OrderedDict()
        self.cooled = 0  # protected slots moved back to probation by the aging hand

    def __len__(self) -> int:
        return len(self._ring) + len(self._probation)

    def __contains__(self, slot: int) -> bool:
        return slot in self._ring or slot in self._probation

    def __iter__(self) -> Iterator[int]:
        yield from self._probation
        yield from self._ring

    def is_earned(self, slot: int) -> bool:
        return slot in self._ring

    def add(self, slot: int, earned: bool = True) -> None:
        self.remove(slot)
        ring = self._ring if earned else self._probation
        ring[slot] = None

    def remove(self, slot: int) -> None:
        self._ring.pop(slot, None)
        self._probation.pop(slot, None)

    def hit(self, slot: int) -> None:
        self.order.hit(slot)

    def hit_all(self, slots: Iterable[int]) -> None:
        self.order.hit_all(slots)

    def forget(self, slot: int) -> None:
        self.remove(slot)
        self.order.forget(slot)

    def victim(self, can_evict: Callable[[int], bool]) -> int | None:
        slot = self.order.pick(self._probation, can_evict)
        return slot if slot is not None else self.order.pick(self._ring, can_evict)

    def victim_unearned(self, can_evict: Callable[[int], bool]) -> int | None:
        """A victim from probation only (None when none can go): content that has not earned a place displaces
        only its own kind."""
        return self.order.pick(self._probation, can_evict)

    def pick(self, ring: OrderedDict[int, None], can_evict: Callable[[int], bool]) -> int | None:
        return self.order.pick(ring, can_evict)

    def age(self, slot: int) -> bool:
        return self.order.age(slot)

    def cool(self, n: int) -> None:
        """Moves the aging hand n protected slots on (at most once round): a cold slot goes back to
        probation (its most recent end), a warm one spends a credit and goes round again."""
        ring = self._ring
        for _ in range(min(n, len(ring))):
            slot = next(iter(ring))
            del ring[slot]
            if self.order.age(slot):
                self._probation[slot] = None
                self.cooled += 1
            else:
                ring[slot] = None
