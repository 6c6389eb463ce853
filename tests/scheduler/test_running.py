"""The running rows' rules (running.py) and admission's entry (admission_entry.py), which schedule() and the
simulator's fast-forward both ask: each against the plain code it stands for."""

from __future__ import annotations

import random

import pytest
from sched_helpers import kv_config, make, next_token, req, step, toks

from kvloop.engine.core.batch import ScheduledBatch, StepResult
from kvloop.engine.scheduler import scheduler as scheduler_module
from kvloop.engine.scheduler.admission_entry import admission_shut, admission_tried
from kvloop.engine.scheduler.running import place, split_budget, steps_to_block


def row_by_row(budget: int, wants: list[int]) -> list[int]:
    grants = []
    for want in wants:
        if budget <= 0:
            break
        grants.append(min(want, budget))
        budget -= grants[-1]
    return grants


def test_split_budget_is_the_row_by_row_rule():
    rng = random.Random(3)
    for _ in range(3000):
        wants = [rng.choice((1, 1, 1, rng.randint(0, 600))) for _ in range(rng.randint(0, 30))]
        budget = rng.randint(-2, 700)
        assert split_budget(budget, wants) == row_by_row(budget, wants), (budget, wants)


def reference_running(sched, batch: ScheduledBatch, budget: int) -> int:
    """The running rows' step as schedule() ran it row by row: kv.allocate for every row, preempting the
    newest."""
    i = 0
    while i < len(sched.running) and budget > 0:
        seq = sched.running[i]
        n = min(seq.num_uncomputed_tokens, budget)
        while not sched.kv.allocate(seq, seq.num_computed_tokens + n):
            victim = sched.running[-1]
            sched.preempt(victim)
            if victim is seq:
                break
        else:
            place(batch, seq, n)
            budget -= n
            i += 1
    return budget


def crowd(mode: str, host_tokens: int):
    """A pool that holds the prompts but not everyone's decode growth, and a budget that splits prefills."""
    s = make(num_blocks=24, kv=kv_config(mode, host_cache_tokens=host_tokens, watermark=0.0),
             decode_reserve_tokens=0, max_num_batched_tokens=24)
    for i in range(6):
        s.add(req(str(i), toks(i % 3, 14) + toks(10 + i, 3), 20))
    return s


MODES = [("continuous", 0), ("continuous+lru", 0), ("codesign", 1024)]  # (mode, host tier tokens)


@pytest.mark.parametrize(("mode", "host_tokens"), MODES)
def test_the_running_step_is_the_row_by_row_one(monkeypatch, mode, host_tokens):
    """Under preemption (swap and recompute) and a budget that ends inside a prefill: the same batches and the
    same preemptions as kv.allocate called for every row."""
    runs = []
    for reference in (False, True):
        if reference:
            monkeypatch.setattr(scheduler_module, "schedule_running", reference_running)
        s = crowd(mode, host_tokens)
        batches = []
        for _ in range(2000):
            if not s.has_work():
                break
            batch = s.schedule()
            batches.append([(it.seq.request_id, it.start, it.num_tokens) for it in batch.items])
            s.check_integrity()
            result = StepResult({it.seq.request_id: next_token(it.seq) for it in batch.items if it.samples})
            s.update_from_output(batch, result)
        runs.append((batches, s.num_preemptions, dict(s.preemptions_by_kind)))
        monkeypatch.undo()
    assert runs[0] == runs[1]
    assert runs[0][1] > 0


def kv_state(kv, seq) -> tuple:
    return (list(seq.block_table), list(seq.block_hashes), kv.is_swapped(seq), kv.num_free_blocks,
            kv.num_referenced_blocks, vars(kv.stats).copy())


@pytest.mark.parametrize(("mode", "host_tokens"), MODES)
def test_allocation_due_says_when_allocate_changes_anything(mode, host_tokens):
    """Where allocation_due says no, kv.allocate succeeds and changes nothing (the fast-forward and schedule()
    skip it there); where it says yes, allocate changes something or fails."""
    s = crowd(mode, host_tokens)
    kv, checked = s.kv, [0, 0]
    for _ in range(2000):
        if not s.has_work():
            break
        for seq in [*s.running, *s.waiting]:
            for total in {seq.num_computed_tokens + 1, seq.num_tokens}:
                due, before = kv.allocation_due(seq, total), kv_state(kv, seq)
                if due and seq in s.waiting:
                    continue  # blocks or a swap-in for a waiting request are the scheduler's to decide
                ok = kv.allocate(seq, total)
                changed = kv_state(kv, seq) != before
                assert (ok and not changed) if not due else (changed or not ok), (seq.request_id, total)
                checked[due] += 1
        step(s)
        s.check_integrity()
    assert not s.has_work() and min(checked) > 0


def test_a_decode_row_is_due_where_its_token_starts_a_block():
    """steps_to_block looks allocation_due ahead: after its first decode step, a row needs the KV manager
    exactly in the steps whose token starts a block (and indexes the one just filled)."""
    s = make(num_blocks=64, kv=kv_config("continuous+lru"))
    seq = req("a", toks(1, 10), 40)
    s.add(seq)
    step(s)  # the prompt, and the first token
    step(s)  # the first decode step indexes the prompt's full blocks
    due_steps = 0
    while not seq.is_finished:
        c = seq.num_computed_tokens
        due = s.kv.allocation_due(seq, c + 1)
        assert due == (steps_to_block(c, s.kv.block_size) == 0), c
        due_steps += due
        step(s)
    assert due_steps >= 8


@pytest.mark.parametrize("mode", ["static", "continuous", "continuous+lru", "codesign"])
def test_admission_weighs_the_queue_only_where_the_entry_says(mode):
    """admit() leaves the queue (and the TPOT gate's count) alone where admission_tried says no, and where
    admission is shut no arrival changes that: what the fast-forward's windows rely on."""
    rng = random.Random(5)
    for trial in range(60):
        s = make(num_blocks=64, kv=kv_config("continuous" if mode == "static" else mode), mode=mode,
                 max_num_seqs=rng.randint(1, 4), static_batch_size=2, tpot_target_ms=1.0,
                 cascade_cap_factor=rng.choice((1.0, 2.0)))
        for i in range(rng.randint(0, 6)):
            s.add(req(f"{trial}-{i}", toks(i % 2, rng.randint(3, 9)), 6))
        for _ in range(rng.randint(0, 4)):
            step(s)
        s.observe_step(1.0, True)  # a slow step: the gate, where asked, holds and counts it
        left = rng.randint(-1, 8)
        if admission_shut(s, left):
            s.add(req(f"{trial}-late", toks(7, 5), 6))
            assert not admission_tried(s, left)
        if not admission_tried(s, left):
            waiting, running, holds = list(s.waiting), list(s.running), s.tpot_gate.holds
            s.admit(ScheduledBatch(), left, 0.0)
            assert (list(s.waiting), list(s.running), s.tpot_gate.holds) == (waiting, running, holds)
