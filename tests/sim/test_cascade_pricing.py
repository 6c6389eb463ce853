"""The simulator prices decode steps through the step-cost function the scheduler shares, with each mode's
cascade scope, over block tables the real KV manager built: a W1-like step with 16 rows reading one
cached document costs less in codesign than in continuous (no prefix cache: 16 copies); continuous+lru
(vLLM's cascade) prices it as plain as soon as one row does not share the document, and like codesign
when all do."""

from __future__ import annotations

import random

import pytest

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.sim.modes import Sizing
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.simulator import SimConfig, Simulator


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


SIZING = Sizing(kv_cache_tokens=65536, host_cache_tokens=0, max_num_seqs=64, max_num_batched_tokens=4096)
DOC = toks(1, 2000)


def _advance(sim: Simulator) -> list:
    """One scheduled step, priced by the simulator's runner, with the scheduler's bookkeeping."""
    s = sim.scheduler
    batch = s.schedule()
    s.update_from_output(batch, sim.runner.execute(batch), now=1.0)
    return batch.items


def decode_step(mode: str, profile: str, cold_rows: int) -> tuple[float, float]:
    """(the simulator's price, the plain price) of a decode step of 16 rows on DOC plus `cold_rows` chat
    rows of the same length."""
    sim = Simulator(get_profile(profile, calibration="/nonexistent"), workload=None,
                    config=SimConfig(mode=mode, sizing=SIZING))
    s = sim.scheduler

    def add(rid: str, prompt: list[int], max_tokens: int) -> None:
        s.add(Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)))

    add("warm", DOC + toks(2, 50), 1)  # the document enters the prefix cache (where there is one)
    while s.has_work():
        _advance(sim)
    for i in range(16):
        add(f"q{i}", DOC + toks(10 + i, 50), 64)
    for i in range(cold_rows):
        add(f"chat{i}", toks(100 + i, 2050), 64)
    for _ in range(60):  # prefill everyone (a few chunks each)
        if all(r.first_token_time for r in s.running) and not s.waiting:
            break
        _advance(sim)
    items = _advance(sim)
    assert len(items) == 16 + cold_rows and all(it.num_tokens == 1 for it in items)
    plain = sim.runner.cost.step_for([(it.start, 1, True) for it in items]).seconds
    return sim.runner.last.seconds, plain


@pytest.mark.parametrize("profile", ["cpu", "h200"])
def test_shared_document_decode_is_cheaper_in_codesign(profile):
    codesign, plain = decode_step("codesign", profile, cold_rows=1)
    continuous, plain_c = decode_step("continuous", profile, cold_rows=1)
    assert continuous == pytest.approx(plain_c)  # no prefix cache: nothing shared
    assert codesign < continuous
    assert plain == pytest.approx(plain_c, rel=0.01)  # about the same shapes (rows a step or two apart)
    lru, plain_l = decode_step("continuous+lru", profile, cold_rows=1)
    assert lru == pytest.approx(plain_l)  # one row off the document: no prefix common to all rows


@pytest.mark.parametrize("profile", ["cpu", "h200"])
def test_lru_cascades_only_a_prefix_all_rows_share(profile):
    lru, plain = decode_step("continuous+lru", profile, cold_rows=0)
    codesign, _ = decode_step("codesign", profile, cold_rows=0)
    assert lru < plain
    assert lru == pytest.approx(codesign, rel=1e-3)  # rows a step apart at most
