"""Device prefix index: block hash <-> device block, with each entry's parent and child count (pure Python).

The index is prefix-closed: an entry's parent is the root or another entry, because blocks are indexed
in chain order and a block with indexed children is never dropped. A block is a leaf when no indexed
block names it as parent; only leaves are evicted, so no cached block is ever orphaned."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kvloop.engine.kv.hashing import ROOT

if TYPE_CHECKING:
    from kvloop.engine.kv.event_log import KVEventLog


class PrefixIndex:
    def __init__(self) -> None:
        self._slot_of: dict[int, int] = {}
        self._entry: dict[int, tuple[int, int]] = {}  # slot -> (hash, parent hash)
        self._children: dict[int, int] = {}  # hash -> number of indexed children
        # KV events (kv/event_log.py): every add and remove reported, for routers; None: off (one `if`)
        self.events: KVEventLog | None = None

    def __len__(self) -> int:
        return len(self._slot_of)

    def slot_of(self, h: int) -> int | None:
        return self._slot_of.get(h)

    @property
    def slots(self) -> Mapping[int, int]:
        """hash -> device block, read-only: loops over a prompt's blocks look hashes
        up without a call each."""
        return self._slot_of

    def hash_of(self, slot: int) -> int | None:
        entry = self._entry.get(slot)
        return None if entry is None else entry[0]

    def hashes_of(self, slots: Iterable[int]) -> list[int | None]:
        """hash_of each slot, in one pass."""
        return [None if entry is None else entry[0] for entry in map(self._entry.get, slots)]

    def add(self, slot: int, h: int, parent: int) -> None:
        assert h not in self._slot_of and slot not in self._entry
        self._slot_of[h] = slot
        self._entry[slot] = (h, parent)
        if parent != ROOT:
            self._children[parent] = self._children.get(parent, 0) + 1
        if self.events is not None:
            self.events.stored(h, parent)

    def remove(self, slot: int) -> int:
        h, parent = self._entry.pop(slot)
        del self._slot_of[h]
        assert not self._children.get(h), "removing an indexed block that still has children"
        self._children.pop(h, None)
        if parent != ROOT:
            left = self._children[parent] - 1
            if left:
                self._children[parent] = left
            else:
                del self._children[parent]
        if self.events is not None:
            self.events.removed(h)
        return h

    def clear(self) -> list[int]:
        """Drops every entry (a cache reset); returns their slots. Reported as one all-cleared event."""
        slots = list(self._entry)
        self._slot_of.clear()
        self._entry.clear()
        self._children.clear()
        if self.events is not None:
            self.events.cleared()
        return slots

    def parent_of(self, slot: int) -> int:
        return self._entry[slot][1]

    def num_children(self, h: int) -> int:
        return self._children.get(h, 0)

    def is_leaf(self, slot: int) -> bool:
        return not self._children.get(self._entry[slot][0])

    def entries(self) -> dict[int, tuple[int, int]]:
        return dict(self._entry)

    def check(self) -> None:
        children: dict[int, int] = {}
        for slot, (h, parent) in self._entry.items():
            assert self._slot_of[h] == slot, "hash and slot maps disagree"
            if parent != ROOT:
                assert parent in self._slot_of, "an indexed block's parent is not indexed (orphan)"
                children[parent] = children.get(parent, 0) + 1
        assert len(self._slot_of) == len(self._entry)
        assert children == self._children, "child counts are wrong"
