"""The simulator's speed paths give exactly what the plain code gives: the cascade planner (its prefix tree
kept across steps) against an independent reference, the block-by-block walk over a trie of the rows' tables;
fast-forward windows against step-by-step runs."""

from __future__ import annotations

import dataclasses
import gc
import random

import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.engine.cascade.plan import CascadeGroup, CascadePlan, CascadePlanner, build_plan
from kvloop.engine.core.policy import policy_names
from kvloop.engine.kv.hashing import ChainHasher, TupleChainKeys
from kvloop.engine.sim import simulator
from kvloop.engine.sim.modes import Sizing
from kvloop.engine.sim.workload import OutputTokens
from kvloop.sidecar.settings import Settings


def walk_plan(tables, context_lens, block_size, worth, nested=True):
    """The reference: a trie walked block by block, row by row (slow and plain, no state across steps)."""
    full = [max(0, (n - 1) // block_size) for n in context_lens]
    groups, suffix = [], [0] * len(tables)
    stack = [(list(range(len(tables))), 0, 0)]
    while stack:
        rows, depth, covered = stack.pop()
        end = depth
        if len(rows) > 1:
            first = rows[0]
            while all(end < full[r] for r in rows) and all(tables[r][end] == tables[first][end]
                                                           for r in rows):
                end += 1
        if end > covered and len(rows) > 1 and worth(len(rows), (end - covered) * block_size):
            ids = tuple(int(b) for b in tables[rows[0]][covered:end])
            groups.append(CascadeGroup(tuple(sorted(rows)), ids, covered * block_size, len(ids) * block_size))
            covered = end
            for r in rows:
                suffix[r] = covered * block_size
        if not nested:
            break
        children: dict[int, list[int]] = {}
        for r in rows:
            if end < full[r]:
                children.setdefault(int(tables[r][end]), []).append(r)
        for child in children.values():
            if len(child) > 1:
                stack.append((child, end, covered))
    if not groups:
        return None
    groups.sort(key=lambda g: (g.start_token, g.rows))
    return CascadePlan(tuple(groups), tuple(suffix), block_size)


def random_rows(rng: random.Random, n: int) -> tuple[list[list[int]], list[int]]:
    """Rows as the KV manager lays them out: a trie of shared prefixes (system prompt, documents, chat
    histories), then private blocks; contexts end anywhere in or past the last block."""
    bs, next_id = 4, iter(range(1, 10**6))
    prefixes = [[]]
    for _ in range(rng.randint(1, 8)):
        parent = rng.choice(prefixes)
        prefixes.append(parent + [next(next_id) for _ in range(rng.choice((1, 3, 6, 40)))])
    tables, lens = [], []
    for _ in range(n):
        t = rng.choice(prefixes) + [next(next_id) for _ in range(rng.randint(0, 4))]
        if not t:
            t = [next(next_id)]
        tables.append(t)
        lens.append(rng.randint(max(1, (len(t) - 1) * bs - 2), len(t) * bs))
    return tables, lens


@pytest.mark.parametrize("nested", [True, False])
def test_a_plan_is_the_reference_walks(nested):
    rng = random.Random(7)

    def worth(members: int, tokens: int) -> bool:
        return members * tokens > 24

    for _ in range(400):
        tables, lens = random_rows(rng, rng.randint(1, 12))
        assert build_plan(tables, lens, 4, worth, nested) == walk_plan(tables, lens, 4, worth, nested)


@pytest.mark.parametrize("mode", policy_names())
def test_a_run_makes_no_reference_cycles(simulate, mode):
    """Simulator.run turns the cyclic collector off while it steps: that is only free of leaks while the
    loop leaves all its garbage to reference counting."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        sim, _ = simulate(mode, feedback=Settings(period_s=1.0))  # held: the simulator itself is one cycle
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def shapes_of(plan) -> list[tuple[int, int]]:
    return [] if plan is None else [(len(g.rows), g.num_tokens) for g in plan.groups]


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hinted", [False, True])
def test_the_planner_follows_the_reference_walk_step_after_step(nested, seed, hinted):
    """Rows join (at the end or in the middle), leave, grow a block, are rewritten in place (past their
    committed blocks, which `fixed` then names), and keep a key while their tables change (the plan is then
    reused): at every step the planner's plan, and its shapes (read alone, as pricing reads them), are the
    reference walk's over the tables of the key's first step."""
    rng = random.Random(seed)
    bs, next_id = 4, iter(range(1, 10**6))

    def worth(members: int, tokens: int) -> bool:
        return members * tokens > (24 if seed % 2 else 4) and tokens != 8

    prefixes = [[]]
    for _ in range(10):
        prefixes.append(rng.choice(prefixes) + [next(next_id) for _ in range(rng.choice((1, 2, 5, 30)))])
    rows: list[list] = []  # [identity, table, context, committed blocks]
    planner, pricing = CascadePlanner(bs, worth, nested), CascadePlanner(bs, worth, nested)
    last_key, expected, changes = None, None, 0
    for step in range(300):
        if rows and rng.random() < 0.3:
            rows.pop(rng.randrange(len(rows)))
        for _ in range(rng.choice((0, 0, 1, 2))):
            t = rng.choice(prefixes) + [next(next_id) for _ in range(rng.randint(0, 2))]
            row = [(step, rng.random()), t or [next(next_id)], 0, 0]
            row[2] = rng.randint(max(1, (len(row[1]) - 1) * bs), len(row[1]) * bs)
            row[3] = rng.randint(0, len(row[1]))
            rows.insert(rng.choice((len(rows), rng.randint(0, len(rows)))), row)
        for row in rows:
            if rng.random() < 0.3:
                row[2] += 1
                if row[2] > len(row[1]) * bs:
                    row[1].append(next(next_id))
            if rng.random() < 0.02 and len(row[1]) > row[3]:  # a block replaced in place (a dedup at commit)
                row[1][rng.randrange(row[3], len(row[1]))] = rng.choice(rng.choice(prefixes) or [1])
            if rng.random() < 0.2:
                row[3] = min(len(row[1]), row[3] + 1)
        key = tuple(r[0] for r in rows)
        tables, lens = [r[1] for r in rows], [r[2] for r in rows]
        fixed = [r[3] for r in rows] if hinted else None
        if key != last_key:
            last_key, expected, changes = key, walk_plan(tables, lens, bs, worth, nested), changes + 1
        assert planner.plan(key, tables, lens, fixed) == expected, step
        assert planner.shapes(key, tables, lens, fixed) == shapes_of(expected), step
        assert pricing.shapes(key, tables, lens, fixed) == shapes_of(expected), step
    assert planner.builds == pricing.builds == changes > 150


@pytest.mark.parametrize("nested", [True, False])
def test_the_planner_without_distinct_identities(nested):
    """Two rows with one identity: planned by position for that step, and the next key starts afresh."""
    always = lambda m, t: m > 1  # noqa: E731
    planner = CascadePlanner(4, always, nested)
    tables, lens = [[1, 2, 3], [1, 2, 4], [1, 5]], [12, 12, 8]
    assert planner.plan(("a", "a", "b"), tables, lens) == walk_plan(tables, lens, 4, always, nested)
    assert planner.shapes(("a", "b", "c"), tables, lens) == ([(3, 4), (2, 4)] if nested else [(3, 4)])
    assert planner.plan((0, 1, 2), tables, lens) == walk_plan(tables, lens, 4, always, nested)


def run_both(simulate, mode, **cfg):
    results = []
    for fast in (True, False):
        _, res = simulate(mode, wl=bw.w1(0.25, num_doc_questions=16, num_sessions=4, rate=4.0),
                          fast_forward=fast,
                          **cfg)
        results.append(res)
    return results


@pytest.mark.parametrize("mode", policy_names())
def test_fast_forward_is_exact_under_pressure(simulate, mode):
    """A pool that preempts (swaps and recomputes) and a token budget that starves rows behind a long prefill:
    fast-forward hands those steps to schedule() and matches step-by-step runs exactly."""
    sizing = Sizing(kv_cache_tokens=1536, host_cache_tokens=2048, disk_cache_tokens=0, max_num_seqs=12,
                    max_num_batched_tokens=96, static_batch=4)
    fast, slow = run_both(simulate, mode, sizing=sizing)
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert fast["client"] == slow["client"]
    assert fast["server"] == slow["server"]
    if mode in ("continuous", "continuous+lru"):  # codesign's gate keeps it from preempting here
        assert slow["server"]["preemptions"] > 0


@pytest.mark.parametrize("mode", ["continuous+lru", "codesign"])
def test_fast_forward_is_exact_with_the_coordinator(simulate, mode):
    """The coordinator samples and decides between steps (fast-forward hands back for
    each) and moves the knobs."""
    fast, slow = run_both(simulate, mode, feedback=Settings(period_s=2.0))
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert fast["client"] == slow["client"]
    assert fast["server"] == slow["server"]
    assert fast["feedback"] == slow["feedback"]


@pytest.mark.parametrize("mode", ["continuous+lru", "codesign"])
def test_fast_forward_is_exact_with_a_tpot_target(simulate, smoke_sizing, mode):
    """The TPOT gate reads every step's time (windows hand theirs over at their end) and holds admission in
    the steps fast-forward takes itself: the same run as step by step, held as often."""
    sizing = dataclasses.replace(smoke_sizing, tpot_target_ms=100.0)
    runs = []
    for fast in (True, False):
        runs.append(simulate(mode, wl=bw.w1(0.25, num_doc_questions=16, num_sessions=4, rate=4.0),
                             fast_forward=fast, sizing=sizing))
    (fast_sim, fast), (slow_sim, slow) = runs
    assert fast_sim.scheduler.tpot_gate.holds == slow_sim.scheduler.tpot_gate.holds > 0
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert fast["client"] == slow["client"] and fast["client"]["completed"] == 32
    assert fast["server"] == slow["server"]


def test_output_tokens_split_into_base_and_position_as_called():
    """Fast-forward writes steady rows' tokens from a request's kept hash (OutputTokens.base/at): the same
    tokens as the runner's call, also after the request is forgotten."""
    token = OutputTokens(128256)
    for rid in ("d1", "s3-t2", "p0d17"):
        base = token.base(rid)
        assert [token.at(base, p) for p in range(50)] == [token(rid, p) for p in range(50)]
        token.forget(rid)
        assert token.at(base, 7) == OutputTokens(128256)(rid, 7)


@pytest.mark.parametrize("mode", ["continuous+lru", "codesign"])
def test_tuple_keys_simulate_as_the_engine_keys(simulate, monkeypatch, mode):
    """The simulator's block keys (Python's tuple hash) stand in for the engine's blake2b keys: the same run,
    under pressure (evictions, host copies, preemptions) and with the coordinator moving the knobs."""
    sizing = Sizing(kv_cache_tokens=1536, host_cache_tokens=2048, disk_cache_tokens=0, max_num_seqs=12,
                    max_num_batched_tokens=96, static_batch=4)
    tuple_sim, with_tuples = simulate(mode, wl=bw.w1(0.25, num_doc_questions=16, num_sessions=4, rate=4.0),
                                      sizing=sizing, feedback=Settings(period_s=2.0, law_kind="rules"))
    assert isinstance(tuple_sim.kv._hasher, TupleChainKeys)
    monkeypatch.setattr(simulator, "TupleChainKeys", ChainHasher)
    chain_sim, with_chains = simulate(mode, wl=bw.w1(0.25, num_doc_questions=16, num_sessions=4, rate=4.0),
                                      sizing=sizing, feedback=Settings(period_s=2.0, law_kind="rules"))
    assert isinstance(chain_sim.kv._hasher, ChainHasher)
    assert with_tuples["client"] == with_chains["client"] and with_tuples["server"] == with_chains["server"]
    assert with_tuples["feedback"] == with_chains["feedback"] and with_tuples["feedback"]["changes"]
    assert vars(tuple_sim.kv.stats) == vars(chain_sim.kv.stats) and tuple_sim.kv.stats.evictions > 0
    assert (tuple_sim.kv.stats.demotions_host > 0 if mode == "codesign"
            else with_tuples["server"]["preemptions"] > 0)
