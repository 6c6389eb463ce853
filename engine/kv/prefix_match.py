"""What `KVCacheManager.peek_prefix` reports: the cached prefix a lookup would attach now (pure Python)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixMatch:
    """The leading full blocks of a token sequence that the cache holds, in order, with the tier holding
    each ("device", "host" or "disk"). Empty on a miss (no prefix cache, or shorter than the minimum
    reusable prefix)."""

    hashes: tuple[int, ...] = ()
    tiers: tuple[str, ...] = ()
    block_size: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.tiers)

    @property
    def tokens(self) -> int:
        return len(self.tiers) * self.block_size

    @property
    def tokens_by_tier(self) -> dict[str, int]:
        """Tokens per tier, as lookup_prefix records them in seq.cached_tokens_by_tier."""
        out: dict[str, int] = {}
        for tier in self.tiers:
            out[tier] = out.get(tier, 0) + self.block_size
        return out
