"""Flushing the cache to the disk tier at shutdown, so that a restart comes back warm (pure Python; part
of the KV manager, split out to keep files small). The public contract is in kv.manager's docstring."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvloop.engine.kv.manager import KVCacheManager


class PersistMixin:
    def persist(self: KVCacheManager, deadline: float) -> dict[str, int]:
        """Writes every cached block of the device pool and the host tier that the disk lacks (all of them
        full blocks of prefixes requests used: the working set a restart should find), in prefix order,
        then waits for the writes to land, all before `deadline` (time.monotonic()). Writes wait for room
        in the queue instead of dropping. What the deadline cuts off is a prefix-closed subset, which a
        restarted engine still serves. Returns counts: written, skipped (deadline), on_disk."""
        if self.disk is None:
            return {"written": 0, "skipped": 0, "on_disk": 0}
        plan = self.persist_plan()[: self.disk.capacity]  # more would evict the plan's own heads
        written = 0
        for h, tier, index in plan:
            if time.monotonic() >= deadline:
                break
            if not self.mover.disk_write(h, tier, index, timeout=max(0.0, deadline - time.monotonic())):
                break
            self._disk_added(h)
            written += 1
        done = [h for h, _, _ in plan[:written]]
        self.disk.touch_chain(done)
        if self.mover.flush(timeout=max(0.0, deadline - time.monotonic())):
            self.mover.disk_set_order(done[::-1])  # a restart's scan: tails oldest, heads the most recent
        return {"written": written, "skipped": len(plan) - written, "on_disk": len(self.disk)}

    def persist_plan(self: KVCacheManager) -> list[tuple[int, str, int]]:
        """(hash, tier, index) of the device and host blocks the disk lacks, parents before children."""
        parent_of: dict[int, int | None] = {}
        source: dict[int, tuple[str, int]] = {}
        if self.host is not None:
            for h, (slot, parent) in self.host.entries().items():
                parent_of[h], source[h] = parent, ("host", slot)
        for block, (h, parent) in self.index.entries().items():  # the device copy wins: it is the newest
            parent_of[h], source[h] = parent, ("device", block)
        depth: dict[int, int] = {}

        def depth_of(start: int) -> int:
            chain, h = [], start
            while h not in depth:
                parent = parent_of.get(h)
                if parent not in parent_of:  # a root, or a parent no tier here holds (maybe on disk already)
                    depth[h] = 0
                    break
                chain.append(h)
                h = parent
            for c in reversed(chain):
                depth[c] = depth[parent_of[c]] + 1
            return depth[start]

        todo = [h for h in source if not self.disk.has(h)]
        todo.sort(key=depth_of)
        return [(h, *source[h]) for h in todo]
