"""Cache-aware admission and the live batch cap (pure Python)."""

from __future__ import annotations

import math

from sched_helpers import kv_config, make, req, run_all, step, toks

from kvloop.engine.control.hook import apply_targets
from kvloop.engine.control.records import Targets

DOC = toks(1, 64)  # 16 blocks of 4 tokens


def _warm(s) -> None:
    """Runs one question over DOC to completion, so DOC's blocks are cached on the device."""
    s.add(req("warm", DOC + toks(99, 4), 2))
    run_all(s)


def _admitted(s, prompts: list[list[int]]) -> int:
    for i, p in enumerate(prompts):
        s.add(req(f"r{i}", p, 8))
    s.schedule()
    return len(s.running)


def test_hits_let_more_in_and_a_cold_flood_fewer_with_the_watermark_kept():
    hot = make(num_blocks=128, kv=kv_config())
    _warm(hot)
    n_hot = _admitted(hot, [DOC + toks(10 + i, 4) for i in range(20)])
    cold = make(num_blocks=128, kv=kv_config())
    _warm(cold)
    n_cold = _admitted(cold, [toks(100 + i, 68) for i in range(20)])
    assert n_hot == 20  # the document is shared: each question needs ~4 blocks
    assert n_cold < n_hot
    kv = cold.kv
    assert n_cold == (128 - math.ceil(0.25 * 128)) // 19  # 17 prompt blocks + 2 of decode reserve each
    # the watermark share stays free or cached while the cold flood waits
    assert kv.num_free_blocks >= math.ceil(kv.watermark * kv.num_blocks)
    run_all(cold)
    run_all(hot)


def test_watermark_is_live():
    s = make(num_blocks=128, kv=kv_config(watermark=0.0))
    s.kv.set_watermark(0.5)
    n = _admitted(s, [toks(100 + i, 68) for i in range(20)])
    assert n == 64 // 19
    run_all(s)


def test_continuous_mode_admits_fcfs_until_memory_runs_out():
    s = make(num_blocks=128, kv=kv_config("continuous+lru"))
    assert s.mode == "continuous+lru"
    n = _admitted(s, [toks(100 + i, 68) for i in range(20)])
    assert n == 128 // 18  # prompt blocks only: no reserve, no watermark
    run_all(s)


def test_lone_request_bigger_than_the_gate_still_runs():
    s = make(num_blocks=32, kv=kv_config(watermark=0.9))
    s.add(req("big", toks(5, 100), 4))
    s.schedule()
    assert len(s.running) == 1
    run_all(s)


def test_batch_cap_is_live_and_the_control_hook_uses_the_setter():
    s = make(kv=kv_config(), max_num_seqs=8)

    class Engine:
        scheduler = s
        kv = s.kv

    apply_targets(Engine, Targets(batch_cap=2, watermark=0.3))
    assert s.batch_cap == 2 and s.kv.watermark == 0.3
    for i in range(5):
        s.add(req(str(i), toks(i, 6)))
    s.schedule()
    assert len(s.running) == 2
    s.set_batch_cap(4)
    s.schedule()
    assert len(s.running) == 4
    s.set_batch_cap(1)  # lowering preempts nobody; admission waits
    s.schedule()
    assert len(s.running) == 4 and s.num_preemptions == 0
    run_all(s)


def test_outstanding_is_the_sum_of_each_rows_target_less_its_blocks():
    """outstanding() inlines target_blocks for speed (every running row, every step): the two agree at every
    step of a run with decodes crossing blocks, rows reaching max_tokens and new rows joining."""
    s = make(num_blocks=256, kv=kv_config())
    for i in range(6):
        s.add(req(f"r{i}", toks(200 + i, 5 + 7 * i), 3 + 5 * i))
    gate, checked = s.gate, 0
    for _ in range(500):
        if not s.has_work():
            break
        step(s)
        expected = sum(max(0, gate.target_blocks(r) - len(r.block_table)) for r in s.running)
        assert gate.outstanding(s.running) == expected
        checked += expected > 0
    assert checked and not s.has_work()
