"""PrefixView.peek: the KV manager's match (peek_prefix) with its device blocks split into those running
sequences hold (shared, and by how many) and those only cached; lower tiers counted apart."""

from __future__ import annotations

from sched_helpers import kv_config, make, req, run_all, step, toks

DOC = toks(1, 32)  # eight blocks of four tokens


def test_view_splits_the_managers_match_into_shared_and_cached():
    s = make(kv=kv_config("codesign"), max_num_seqs=4)
    first = req("first", DOC + toks(2, 3), max_tokens=8)
    s.add(first)
    step(s)  # the whole prompt in one step
    step(s)  # a decode step: its allocation commits DOC's blocks to the index; first holds them
    joiner = req("joiner", DOC + toks(3, 5))
    hit = s.view.peek(joiner)
    match = s.kv.peek_prefix(joiner)
    assert match.tiers == ("device",) * 8
    assert (hit.shared, hit.cached, hit.lower, hit.sharers) == (8, 0, 0, 1)
    run_all(s)  # first ends: its blocks stay cached, held by nobody
    hit = s.view.peek(joiner)
    assert (hit.shared, hit.cached, hit.blocks) == (0, 8, s.kv.peek_prefix(joiner).num_blocks)


def test_view_counts_lower_tier_blocks_and_follows_the_managers_rules():
    s = make(num_blocks=12, kv=kv_config("codesign", host_cache_tokens=64, min_prefix_tokens=16))
    for rid in ("a", "b"):
        s.add(req(rid, DOC + [7]))
        run_all(s)
    s.add(req("flood", toks(10, 40)))  # pushes DOC's blocks to the host tier
    run_all(s)
    doc = req("doc", DOC + [7])
    match = s.kv.peek_prefix(doc)
    hit = s.view.peek(doc)
    assert "host" in match.tiers
    assert hit.lower == match.tiers.count("host") + match.tiers.count("disk")
    assert hit.blocks == match.num_blocks
    short = req("short", DOC[:12] + [7])  # three blocks: under the minimum of 16 tokens
    assert s.kv.peek_prefix(short).num_blocks == 0 and s.view.peek(short).blocks == 0


def test_remembered_peeks_hold_until_forgotten():
    """Grouped admission peeks a candidate to order, price and gate it: within `remembered` the first peek
    stands until `forget` (called after anything that changes the cache), then the cache is read again."""
    s = make(kv=kv_config("codesign"), max_num_seqs=4)
    first = req("first", DOC + toks(2, 3), max_tokens=8)
    s.add(first)
    step(s)
    step(s)  # first holds DOC's eight blocks
    joiner = req("joiner", DOC + toks(3, 5))
    with s.view.remembered():
        held = s.view.peek(joiner)
        run_all(s)  # first ends: DOC's blocks are only cached now
        assert s.view.peek(joiner) is held and held.shared == 8  # remembered, as told
        s.view.forget()
        assert (s.view.peek(joiner).shared, s.view.peek(joiner).cached) == (0, 8)
    assert s.view.peek(joiner) is not s.view.peek(joiner)  # outside: every peek reads the cache
