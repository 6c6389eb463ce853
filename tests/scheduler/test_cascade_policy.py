"""Each mode's cascade scope, chosen in one place: codesign cascades any shared prefix, nested groups
included; continuous+lru only the prefix common to every decode row (vLLM's cascade), so its plan has
at most one group and that group covers all rows. The runner gets the scope from the scheduler."""

from __future__ import annotations

import random

import pytest

from kvloop.engine.bench.sizing import Sizing, mode_configs
from kvloop.engine.cascade.plan import build_plan
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.config import resolve_cascade_groups
from kvloop.engine.scheduler.scheduler import Scheduler


def always(members: int, tokens: int) -> bool:
    return True


# rows 0-3 share blocks 10, 11 (a system prompt); rows 0-1 then 20, 21 (a document), rows 2-3 block 30
NESTED = [[10, 11, 20, 21, 40], [10, 11, 20, 21, 41], [10, 11, 30, 42], [10, 11, 30, 43]]
LENS = [19, 18, 15, 13]


@pytest.mark.parametrize(("mode", "scope"), [("codesign", "nested"), ("continuous+lru", "common"),
                                             ("continuous", "nested"), ("static", "nested")])
def test_mode_configs_pick_the_scope(mode, scope):
    sched_cfg, kv_cfg = mode_configs(mode, Sizing())
    s = Scheduler(sched_cfg, KVCacheManager(64, 16, kv_cfg))
    assert s.step_cost.groups == scope == resolve_cascade_groups(sched_cfg.cascade_groups, mode)


def test_common_scope_has_one_group_of_all_rows_and_nested_has_more():
    nested = build_plan(NESTED, LENS, 4, always, nested=True)
    common = build_plan(NESTED, LENS, 4, always, nested=False)
    assert nested is not None and len(nested.groups) == 3  # system prompt, then each document
    assert common is not None and [(g.rows, g.block_ids) for g in common.groups] == [((0, 1, 2, 3), (10, 11))]
    assert common.suffix_start == (8, 8, 8, 8)
    # a prefix shared by only some rows: vLLM's cascade has nothing to do, nested still groups them
    some = [t[2:] for t in NESTED[:3]] + [[99, 98]]
    assert build_plan(some, [11, 10, 7, 6], 4, always, nested=False) is None
    assert build_plan(some, [11, 10, 7, 6], 4, always, nested=True) is not None


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def _run_grouped(engine, prompts: list[list[int]], warm: list[list[int]]) -> None:
    """Warms the shared prefixes into the cache, then decodes `prompts` together (they attach the cached
    blocks, so their tables really begin with the same block ids)."""
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for i, p in enumerate(warm):
        engine.add_request(f"warm{i}", p, params)
    while engine.has_unfinished():
        engine.step()
    engine.runner.cascade_group_sizes.clear()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    for _ in range(50):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("mode", ["codesign", "continuous+lru"])
def test_the_runner_plans_with_the_modes_scope(make_engine, mode):
    """Real engine, cascade forced (no cost gate): two documents shared by two rows each. codesign
    cascades each pair; continuous+lru has no prefix common to all four rows, so nothing."""
    eng = make_engine(mode=mode, cascade="always", kv_cache_tokens=4096)
    assert eng.runner.planner.nested is (mode == "codesign")
    assert eng.scheduler.step_cost.attention is eng.runner.attention_cost
    doc_a, doc_b = toks(1, 64), toks(2, 64)
    _run_grouped(eng, [doc_a + toks(10, 5), doc_a + toks(11, 6), doc_b + toks(12, 5), doc_b + toks(13, 7)],
                 warm=[doc_a + toks(3, 2), doc_b + toks(4, 2)])
    sizes = eng.runner.cascade_group_sizes
    if mode == "codesign":
        assert sizes[2] > 0 and set(sizes) == {2}
    else:
        assert not sizes


def test_common_scope_cascades_a_prefix_all_rows_share(make_engine):
    eng = make_engine(mode="continuous+lru", cascade="always", kv_cache_tokens=4096)
    system = toks(5, 48)
    _run_grouped(eng, [system + toks(20 + i, 4 + i) for i in range(4)], warm=[system + toks(6, 2)])
    assert set(eng.runner.cascade_group_sizes) == {4}  # one group, every row
