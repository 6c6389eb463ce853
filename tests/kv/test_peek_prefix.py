"""KVCacheManager.peek_prefix: the match lookup_prefix then attaches, by tier, and a read that changes nothing
(statistics, ghost counts, eviction clocks, LRU order, disk recency)."""

from __future__ import annotations

import pytest
from kv_helpers import ONE_TOKEN, fake_manager, manager_state, serve

from kvloop.engine.core.sequence import Sequence
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.kv.prefix_match import PrefixMatch

BS = 4
DOC = list(range(1, 26))  # six full blocks and one token


def make(mode: str = "codesign", host_blocks: int = 3, min_prefix_tokens: int = 0) -> KVCacheManager:
    # the host tier takes blocks two requests used (DOC's), the disk tier any (the flood's too)
    cfg = KVConfig(mode=mode, admit_min_requests=1, host_admit_min_requests=2, disk_admit_min_requests=1,
                   min_prefix_tokens=min_prefix_tokens, watermark=0.0, host_cache_tokens=host_blocks * BS,
                   disk_dir="unused-by-the-fake", disk_cache_tokens=32 * BS)
    return fake_manager(8, BS, cfg, "m")


def spread_over_tiers(kv: KVCacheManager) -> None:
    """DOC's blocks end up on the device (first), in the host tier (next two) and on disk (the rest): a
    flood pushes them all down, then a request sharing the first block promotes it. The flood's blocks
    stay out of the host tier, so promoting DOC's blocks (which evicts them) moves none of DOC's copies."""
    serve(kv, "doc", DOC)
    serve(kv, "doc-again", DOC)
    serve(kv, "flood", list(range(100, 132)))
    serve(kv, "first-block", DOC[:BS] + [999])


def test_peek_is_what_lookup_attaches_across_tiers_and_changes_nothing():
    kv = make()
    spread_over_tiers(kv)
    seq = Sequence("again", DOC, ONE_TOKEN)
    before = manager_state(kv)
    match = kv.peek_prefix(seq)
    assert manager_state(kv) == before
    assert match.tiers == ("device", "host", "host", "disk", "disk", "disk")
    assert kv.peek_prefix(DOC) == match  # token ids match as a new sequence's would
    assert manager_state(kv) == before

    hit = kv.lookup_prefix(seq)
    assert hit == match.tokens == 6 * BS
    assert seq.cached_tokens_by_tier == match.tokens_by_tier == {"device": BS, "host": 2 * BS, "disk": 3 * BS}
    assert seq.block_hashes == list(match.hashes)
    assert manager_state(kv) != before  # the fingerprint does see what a lookup changes
    assert kv.peek_prefix(seq) == PrefixMatch()  # seq holds its blocks now: nothing to look up
    assert kv.peek_prefix(DOC).tiers == ("device",) * 6


@pytest.mark.parametrize("mode", ["codesign", "continuous+lru", "continuous"])
def test_peek_agrees_with_lookup_in_every_cache_policy(mode):
    kv = make(mode)
    spread_over_tiers(kv)
    seq = Sequence("again", DOC, ONE_TOKEN)
    before = manager_state(kv)
    match = kv.peek_prefix(seq)
    assert manager_state(kv) == before
    assert kv.lookup_prefix(seq) == match.tokens
    assert seq.cached_tokens_by_tier == (match.tokens_by_tier if match.tokens else {})
    if mode == "continuous":
        assert match == PrefixMatch()  # no prefix cache
    if mode == "continuous+lru":
        assert set(match.tiers) == {"device"}  # the host tier only swaps; there is no disk tier


def test_peek_never_covers_the_last_token():
    kv = make()
    serve(kv, "doc", DOC)
    assert kv.peek_prefix(DOC[: 2 * BS]).num_blocks == 1  # two blocks: the second holds the last token
    assert kv.peek_prefix(DOC[: 2 * BS + 1]).num_blocks == 2


def test_peek_applies_the_minimum_reusable_prefix():
    kv = make(min_prefix_tokens=4 * BS)
    serve(kv, "doc", DOC)
    assert kv.peek_prefix(DOC).num_blocks == 6
    short = Sequence("short", DOC[: 3 * BS + 1], ONE_TOKEN)  # three blocks: under the minimum of four
    misses = kv.stats.short_prefix_misses
    assert kv.peek_prefix(short) == PrefixMatch()
    assert kv.stats.short_prefix_misses == misses  # a peek counts nothing
    assert kv.lookup_prefix(short) == 0 and kv.stats.short_prefix_misses == misses + 1


def test_without_the_minimum_any_full_block_is_a_hit():
    kv = make("continuous+lru", min_prefix_tokens=4 * BS)  # the minimum is codesign's rule
    serve(kv, "doc", DOC)
    assert kv.peek_prefix(DOC[: BS + 1]).tiers == ("device",)
