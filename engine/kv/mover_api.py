"""What the policy asks of a tier mover, and a do-nothing mover for pure-Python use (simulator,
policy benchmarks, property tests). The real one is kv.tier_mover.TierMover (the only torch code)."""

from __future__ import annotations

from typing import Protocol


class Mover(Protocol):
    def device_to_host(self, block: int, slot: int) -> None: ...
    def host_to_device(self, slot: int, block: int) -> None: ...
    def disk_write(self, h: int, tier: str, index: int, timeout: float = 0.0) -> bool:
        """Queues a write-behind of device block or host slot `index` (tier 'device'|'host') as hash h;
        the data is copied before returning. False when the queue is full (the write is dropped), after
        waiting up to `timeout` seconds for room when timeout > 0."""
    def disk_read(self, h: int, block: int) -> bool:
        """Reads h's file into device block; False (file deleted) when missing, corrupt or foreign."""
    def disk_delete(self, h: int) -> None: ...
    def disk_scan(self) -> list[int]:
        """Hashes with files in the directory, oldest first."""
    def disk_set_order(self, hashes: list[int]) -> None:
        """Makes the next disk_scan list these files in this order (oldest first), after any others."""
    def flush(self, timeout: float | None = None) -> bool:
        """Waits (at most timeout seconds) for the queued writes; True when all have landed."""
    # the remote tier (kv.remote_client through the mover; kv.remote_mixin asks these)
    def remote_available(self) -> bool:
        """A remote store is configured and up (False: no remote tier now)."""
    def remote_contains(self, hashes: list[int]) -> list[bool]: ...
    def remote_prefetch(self, hashes: list[int]) -> None:
        """Fetches and checks these blocks in one batch, for the remote_read calls that follow."""
    def remote_read(self, h: int, block: int) -> bool:
        """Copies h's prefetched (else fetched) value into device block; False when missing or bad."""
    def remote_write(self, h: int, tier: str, index: int) -> bool:
        """Queues a write of device block or host slot `index` as h; False when dropped (down, queue full)."""


class NullMover:
    """Moves nothing and reports success: for bookkeeping-only runs."""

    def device_to_host(self, block: int, slot: int) -> None:
        pass

    def host_to_device(self, slot: int, block: int) -> None:
        pass

    def disk_write(self, h: int, tier: str, index: int, timeout: float = 0.0) -> bool:
        return True

    def disk_read(self, h: int, block: int) -> bool:
        return True

    def disk_delete(self, h: int) -> None:
        pass

    def disk_scan(self) -> list[int]:
        return []

    def disk_set_order(self, hashes: list[int]) -> None:
        pass

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def remote_available(self) -> bool:
        return False

    def remote_contains(self, hashes: list[int]) -> list[bool]:
        return [False] * len(hashes)

    def remote_prefetch(self, hashes: list[int]) -> None:
        pass

    def remote_read(self, h: int, block: int) -> bool:
        return False

    def remote_write(self, h: int, tier: str, index: int) -> bool:
        return False
