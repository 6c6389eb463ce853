"""The KV manager's remote tier (pure Python; part of KVCacheManager, split out to keep files small): the
store's side is kv.remote_client (through the tier mover), what the manager knows of it kv.remote_index.

- Writes: a block is offered when its K/V is complete on the device (committed: the moment a peer engine
  could use it, long before this engine evicts it), again when the device or the host evicts it, and
  queued once its hash passes the remote gate: `remote_admit_min_requests` distinct requests (the ghost
  table's count, as the host and disk gates count; default 1, since a peer's first request for a document
  is the one a shared tier is for). Blocks the store is known to hold are not written again.
- Lookup: before matching, the blocks of the prompt that no local tier holds and that are not known are
  asked of the store in one round trip (only by lookup_prefix; peek reads what is known). A remote block is
  a tier like the others below the disk: the load-or-recompute cut prices it with the link's measured
  seconds per block; the blocks it keeps are fetched in one batch, then copied in block by block. A block
  that is gone, corrupt or foreign ends the hit there (the rest is recomputed), never a wrong token.
- A store that is down is no tier at all: nothing remote is matched and nothing is written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvloop.engine.kv.remote_index import RemoteIndex

if TYPE_CHECKING:
    from kvloop.engine.kv.manager import KVCacheManager

MAX_PROBE = 1024  # blocks asked of the store in one lookup (16k tokens at 16 a block)


def make_remote_index(config, lower_tiers: bool) -> RemoteIndex | None:
    return RemoteIndex() if lower_tiers and config.kv_remote_url else None


class RemoteMixin:
    def _remote_on(self: KVCacheManager) -> bool:
        return self.remote is not None and self.mover.remote_available()

    def _remote_has(self: KVCacheManager, h: int) -> bool:
        return self.remote is not None and self.remote.has(h) and self.mover.remote_available()

    def _remote_probe(self: KVCacheManager, hashes: Sequence[int], num_tokens: int) -> None:
        """Asks the store for the usable blocks of a prompt that no tier here holds (see the module doc)."""
        if not self._remote_on():
            return
        remote, ask = self.remote, []
        for h in hashes[: (num_tokens - 1) // self.block_size]:
            if remote.has(h) or self._local_tier_of(h) is not None:
                continue
            if remote.recently_absent(h) or len(ask) >= MAX_PROBE:
                break  # the chain ends here: blocks after it cannot be used
            ask.append(h)
        if not ask:
            return
        for h, found in zip(ask, self.mover.remote_contains(ask), strict=True):
            if found:
                remote.add(h)
            else:
                remote.absent(h)
                self.stats.remote_misses += 1

    def _local_tier_of(self: KVCacheManager, h: int) -> str | None:
        if self.index.slot_of(h) is not None:
            return "device"
        if self.host is not None and self.host.has(h):
            return "host"
        if self.disk is not None and self.disk.has(h):
            return "disk"
        return None

    def _remote_prefetch(self: KVCacheManager, hashes: Sequence[int], tiers: Sequence[str]) -> None:
        """Fetches the remote blocks a lookup is about to attach, in one batch."""
        if self.remote is None:
            return
        wanted = [h for h, tier in zip(hashes, tiers, strict=True) if tier == "remote"]
        if wanted:
            self.mover.remote_prefetch(wanted)

    def _remote_load(self: KVCacheManager, h: int, block: int) -> bool:
        """Copies h's fetched value into the device block; False (forgotten, a miss) when it was not there."""
        if self.mover.remote_read(h, block):
            self.stats.promotions_remote += 1
            self.remote.add(h)  # recent
            return True
        self.remote.forget(h)
        self.stats.remote_misses += 1
        return False

    def _remote_offer(self: KVCacheManager, h: int, tier: str, index: int) -> None:
        """Queues a write of device block or host slot `index` holding h, if the gate admits it and the store
        is not known to hold it; a dropped write is counted by the client and offered again later."""
        if not self._remote_on() or self.remote.has(h):
            return
        if self.cache_policy.heat_gated:
            least = min(self.config.remote_admit_min_requests, self.ghost.max_count)
            if self.ghost.count(h) < least:
                return
        if self.mover.remote_write(h, tier, index):
            self.remote.add(h)

    def _remote_done(self: KVCacheManager) -> None:
        """Drops what a lookup fetched and did not attach (its promotion stopped short)."""
        if self.remote is not None:
            self.mover.remote_prefetch([])
