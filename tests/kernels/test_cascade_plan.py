"""Group discovery from block identities: the trie over block tables, nested prefixes, the cost gate and
the planner's reuse while the decode set is unchanged."""

from __future__ import annotations

from kvloop.engine.cascade.cost import AttentionCost
from kvloop.engine.cascade.plan import CascadePlanner, build_plan


def always(members: int, tokens: int) -> bool:
    return True


def test_nested_prefixes_chain_and_suffixes_start_after_them():
    bs = 4
    # rows 0-3 share blocks 10, 11 (system prompt); rows 0-1 then share 20, 21 (a document); rows 2-3 share 30
    tables = [[10, 11, 20, 21, 40], [10, 11, 20, 21, 41], [10, 11, 30, 42], [10, 11, 30, 43], [50, 51]]
    lens = [19, 18, 15, 13, 6]
    plan = build_plan(tables, lens, bs, always)
    assert plan is not None
    spans = {(g.rows, g.block_ids, g.start_token, g.num_tokens) for g in plan.groups}
    assert spans == {((0, 1, 2, 3), (10, 11), 0, 8), ((0, 1), (20, 21), 8, 8), ((2, 3), (30,), 8, 4)}
    assert plan.suffix_start == (16, 16, 12, 12, 0)
    assert [g.start_token for g in plan.groups] == sorted(g.start_token for g in plan.groups)  # parents first


def test_only_blocks_filled_before_the_step_are_shared():
    bs = 4
    # both rows hold block 7 but its last slot is written this step by row 1 (context 8 = 2 blocks, the
    # 8th token is new): only block 5 is shared
    plan = build_plan([[5, 7], [5, 7]], [9, 8], bs, always)
    assert plan is not None and [g.block_ids for g in plan.groups] == [(5,)]
    assert plan.suffix_start == (4, 4)
    assert build_plan([[5], [5]], [4, 4], bs, always) is None  # the block is still being written


def test_a_parent_not_worth_it_folds_into_its_children():
    bs = 16
    tables = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [9]]
    lens = [48, 48, 48, 10]

    def only_pairs_over_16(members: int, tokens: int) -> bool:
        return members == 2 and tokens > 16

    plan = build_plan(tables, lens, bs, only_pairs_over_16)
    assert plan is not None
    assert [(g.rows, g.block_ids, g.start_token) for g in plan.groups] == [((0, 1), (1, 2), 0)]
    assert plan.suffix_start == (32, 32, 0, 0)


def test_cost_model_gates_small_groups():
    cost = AttentionCost(call_us=50, row_us=1, token_us=0.05, token_row_us=0.01, merge_us=10)
    assert not cost.worth(1, 10_000)
    assert not cost.worth(2, 16)
    assert cost.worth(16, 2000)
    assert cost.step_us([2000] * 16, [(16, 2000)]) < cost.plain_us([2000] * 16)


def test_planner_reuses_the_plan_until_the_decode_set_changes():
    planner = CascadePlanner(4, always)
    tables, lens = [[1, 2, 3], [1, 2, 4]], [10, 10]
    key = (("a", 0), ("b", 0))
    first = planner.plan(key, tables, lens)
    assert planner.plan(key, tables, [11, 11]) is first and planner.builds == 1
    assert planner.plan((("a", 0),), tables[:1], lens[:1]) is None and planner.builds == 2
    assert planner.plan((("a", 0), ("b", 1)), tables, lens) == first and planner.builds == 3
