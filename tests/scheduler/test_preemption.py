"""Preemption instead of out-of-memory: newest first, swap when the host tier has room, else recompute
(pure Python; the exact-token check with the real model is in test_real_model.py)."""

from __future__ import annotations

from sched_helpers import kv_config, make, next_token, req, run_all, step, toks

from kvloop.engine.core.sequence import SeqStatus


def _reference(prompt: list[int], n: int) -> list[int]:
    seq = req("ref", prompt, n)
    while seq.num_output_tokens < n:
        seq.token_ids.append(next_token(seq))
    return seq.output_token_ids


def _crowd(host_tokens: int, mode: str = "codesign"):
    """A pool that holds the prompts but not everyone's decode growth."""
    s = make(num_blocks=24, kv=kv_config(mode, host_cache_tokens=host_tokens, watermark=0.0),
             decode_reserve_tokens=0)
    seqs = [req(str(i), toks(i, 14), 20) for i in range(4)]
    for q in seqs:
        s.add(q)
    return s, seqs


def test_swap_when_the_host_tier_has_room():
    s, seqs = _crowd(host_tokens=1024)
    run_all(s)
    kinds = s.preemptions_by_kind
    assert kinds["swap"] > 0 and kinds["recompute"] == 0
    assert all(q.output_token_ids == _reference(q.prompt_token_ids, 20) for q in seqs)
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_recompute_without_a_host_tier():
    s, seqs = _crowd(host_tokens=0, mode="continuous")
    run_all(s)
    kinds = s.preemptions_by_kind
    assert kinds["recompute"] > 0 and kinds["swap"] == 0
    assert all(q.output_token_ids == _reference(q.prompt_token_ids, 20) for q in seqs)


def test_the_newest_running_request_is_preempted():
    s, seqs = _crowd(host_tokens=0, mode="continuous")
    while s.num_preemptions == 0:
        step(s)
    assert seqs[-1].num_preemptions == 1 and all(q.num_preemptions == 0 for q in seqs[:-1])
    assert s.waiting[0] is seqs[-1]
    run_all(s)


def test_recompute_when_the_host_tier_is_full():
    s, seqs = _crowd(host_tokens=8)  # two slots: not enough for any request's blocks
    run_all(s)
    assert s.preemptions_by_kind["recompute"] > 0 and s.preemptions_by_kind["swap"] == 0
    assert all(q.output_token_ids == _reference(q.prompt_token_ids, 20) for q in seqs)


def test_every_start_is_a_new_stint():
    """A running row's identity for plan caches (Sequence.stint): distinct per start, and new when a preempted
    request runs again (its blocks were given up: a plan of its old blocks must not be reused)."""
    s, seqs = _crowd(host_tokens=0, mode="continuous")
    while s.num_preemptions == 0:
        step(s)
    first = {q.request_id: q.stint for q in seqs if q.stint}
    assert len(set(first.values())) == len(first) == len(seqs)
    victim = seqs[-1]
    while victim.status is not SeqStatus.RUNNING:
        step(s)
    assert victim.stint > max(first.values())  # numbered anew when it resumed
    assert all(q.stint == first[q.request_id] for q in seqs if not q.num_preemptions)  # kept while running
    run_all(s)
