"""W5's generator: phases alternate with their own rates and mixes, a quarter of RAG questions are one-offs,
chat sessions are closed loop, everything is deterministic by seed; the per-phase split
and the system names."""

from collections import Counter

import pytest

from kvloop.engine.bench import workloads
from kvloop.engine.bench.metrics import RequestRecord, Sample
from kvloop.engine.bench.phases import by_kind, phase_index, split, timeline
from kvloop.engine.bench.sizing import mode_configs
from kvloop.engine.bench.w5_variants import (
    Variant,
    coordinator_base,
    coordinator_settings,
    parse_variant,
    sized,
    tpot_objective,
    w5_systems,
)
from kvloop.engine.bench.w5_workload import (
    CHAT,
    RAG,
    W5_CPU,
    W5_GPU,
    W5Params,
    build_w5,
    parse_phase_rates,
    phase_plan,
    phases_of,
)
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.sim.workload import BenchWorkload

# W5's structure with short sequences, so that thousands of requests build in a blink
SMALL = W5Params(chat_rate=4.0, rag_rate=2.0, duration_s=2400.0, phase_s=300.0, num_docs=40, doc_tokens=64,
                 question_tokens=8, answer_tokens=8, num_systems=3, system_tokens=32, user_tokens=8,
                 reply_tokens=8,
                 vocab_high=5000)


def shares(wl):
    """Per phase kind: (chat turns, RAG questions), a session's turns counted in the phase it started in."""
    plan = phases_of(wl)
    c: Counter = Counter()
    for r in wl.requests:
        c[(plan[phase_index(plan, r.arrival_s)].kind, RAG)] += 1
    for s in wl.sessions:
        c[(plan[phase_index(plan, s.start_s)].kind, CHAT)] += s.num_turns
    return c


def test_phases_alternate_with_their_rates_and_mixes():
    wl = build_w5(SMALL)
    plan = phases_of(wl)
    assert [p.kind for p in plan] == [CHAT, RAG] * 4
    assert [(p.start_s, p.end_s) for p in plan[:2]] == [(0.0, 300.0), (300.0, 600.0)]
    assert {p.kind: p.rate for p in plan} == {CHAT: 4.0, RAG: 2.0}
    c = shares(wl)
    chat_phase = c[(CHAT, CHAT)] / (c[(CHAT, CHAT)] + c[(CHAT, RAG)])
    rag_phase = c[(RAG, RAG)] / (c[(RAG, CHAT)] + c[(RAG, RAG)])
    assert chat_phase == pytest.approx(0.8, abs=0.04)
    assert rag_phase == pytest.approx(0.8, abs=0.04)
    # each phase kind's requests arrive at about its rate (chat phases: 4 req/s over 4 x 300 s)
    assert (c[(CHAT, CHAT)] + c[(CHAT, RAG)]) / 1200 == pytest.approx(4.0, rel=0.1)
    assert (c[(RAG, CHAT)] + c[(RAG, RAG)]) / 1200 == pytest.approx(2.0, rel=0.1)
    # a phase kind alone (for the capacity probes)
    assert {p.kind for p in phase_plan(W5Params(kinds=(RAG,), duration_s=900))} == {RAG}


def test_oneoff_share_and_documents():
    wl = build_w5(SMALL)
    kinds = Counter(r.kind for r in wl.requests)
    assert kinds["oneoff"] / len(wl.requests) == pytest.approx(0.25, abs=0.03)
    docs = [r for r in wl.requests if r.kind == "doc"]
    oneoffs = [r for r in wl.requests if r.kind == "oneoff"]
    # a popular document repeats with its tokens; every one-off's first block is its own (so no prefix of it
    # is shared with anything: chained block hashes)
    by_group = Counter(r.group for r in docs)
    group, n = by_group.most_common(1)[0]
    assert group == "doc0" and n > 1
    assert len({tuple(r.prompt[:64]) for r in docs if r.group == "doc0"}) == 1
    firsts = [tuple(r.prompt[:16]) for r in oneoffs] + [tuple(r.prompt[:16]) for r in docs]
    assert len(set(firsts[:len(oneoffs)])) == len(oneoffs)
    assert not set(firsts[:len(oneoffs)]) & set(firsts[len(oneoffs):])
    assert all(len(r.prompt) == 64 + 8 and r.max_tokens == 8 for r in wl.requests)
    assert all(SMALL.vocab_low <= t < SMALL.vocab_high for r in wl.requests for t in r.prompt)


def test_deterministic_by_seed():
    a, b, c = build_w5(SMALL), build_w5(SMALL), build_w5(W5Params(**{**SMALL.__dict__, "seed": 1}))
    assert [(r.arrival_s, r.prompt) for r in a.requests] == [(r.arrival_s, r.prompt) for r in b.requests]
    assert [(s.start_s, s.system, s.user_turns, s.think_s) for s in a.sessions] == [
        (s.start_s, s.system, s.user_turns, s.think_s) for s in b.sessions]
    assert [r.prompt for r in a.requests[:5]] != [r.prompt for r in c.requests[:5]]


def test_sessions_are_closed_loop():
    wl = build_w5(SMALL)
    s = wl.sessions[0]
    assert s.num_turns == 6 and len(s.think_s) == 5 and s.reply_tokens == 8
    assert len({tuple(x.system) for x in wl.sessions}) == 3  # each system prompt shared by its sessions
    bw = BenchWorkload(wl)
    first = next(x for x in bw.initial() if x.session is s)
    assert first.arrival == s.start_s and first.prompt == s.system + s.user_turns[0]
    reply = [7] * 8
    (nxt,) = bw.on_finish(first, reply, now=100.0)
    assert nxt.arrival == 100.0 + s.think_s[0]  # sent when the reply ends plus the think time
    assert nxt.prompt == s.system + s.user_turns[0] + reply + s.user_turns[1]


def test_named_scales():
    assert W5_GPU.doc_tokens == 6000 and W5_GPU.num_docs == 400
    assert W5_GPU.phase_s == 300 and W5_GPU.turns == 6
    assert W5_CPU.kv_cache_tokens == 12288 and W5_CPU.doc_tokens == 1500 and W5_CPU.phase_s == 120
    wl = workloads.by_name("w5", duration_s=240.0, chat_rate=0.5, rag_rate=0.5)
    assert wl.name == "W5" and len(phases_of(wl)) == 2 and wl.params["kv_cache_tokens"] == 12288
    assert parse_phase_rates("3,1.5") == (3.0, 1.5) and parse_phase_rates(None) is None
    with pytest.raises(ValueError):
        parse_phase_rates("3")
    from kvloop.engine.sim.cli import WORKLOADS

    assert {"w5", "w5-gpu"} <= set(WORKLOADS)


def test_variant_names():
    assert parse_variant("codesign@cap64") == Variant("codesign", cap=64)
    assert parse_variant("continuous+lru") == Variant("continuous+lru")
    v = parse_variant("codesign+coord@10s+events")
    assert v == Variant("codesign", coordinator=True, period_s=10.0,
                        events=True) and v.name == "codesign+coord@10s+events"
    for bad in ("continuous+lru+coord", "codesign@cap8+coord", "nope@cap3"):
        with pytest.raises(ValueError):
            parse_variant(bad)
    names = w5_systems("gpu")
    assert names[:3] == ["continuous+lru", "codesign", "codesign+coord"]
    assert [parse_variant(n).cap for n in names if parse_variant(n).cap] == [16, 32, 64, 128, 256, 512]
    assert [parse_variant(n).period_s for n in names if parse_variant(n).period_s] == [1, 5, 10, 30, 60]
    fb, _ = coordinator_settings(parse_variant("codesign+coord@5s"), cap_max=512)
    assert fb.period_s == 5.0 and fb.batch_cap.max == 512
    assert coordinator_settings(parse_variant("codesign@cap8"))[0] is None
    from kvloop.engine.bench.sizing import Sizing

    assert sized(parse_variant("codesign@cap8"), Sizing()).max_num_seqs == 8
    v = parse_variant("codesign@cap24@tpot80")
    assert v == Variant("codesign", cap=24, tpot_ms=80.0) and v.name == "codesign@cap24@tpot80"
    run = sized(parse_variant("continuous+lru@tpot62.5"), Sizing())
    assert run.tpot_target_ms == 62.5 and run.max_num_seqs == Sizing().max_num_seqs
    assert mode_configs("codesign", run)[0].tpot_target_ms == 62.5
    for bad in ("codesign@tpot0", "codesign@tpot80@cap8", "codesign@tpotfast", "static@tpot80"):
        with pytest.raises(ValueError):
            parse_variant(bad)
    v = parse_variant("codesign@work+coord:goodput")
    assert (v.queue_order, v.law, v.name) == ("work", "goodput", "codesign@work+coord:goodput")
    assert mode_configs("codesign", sized(v, Sizing()))[0].queue_order == "work"
    assert mode_configs("codesign", Sizing())[0].queue_order == "work"  # the scheduler's default
    with pytest.raises(ValueError):
        parse_variant("codesign@fifo")


def test_the_coordinators_tpot_objective_per_scale():
    # GPU: the interactive objective steers the step budget; CPU: none, as the sidecar's
    # defaults; 0 switches it off
    assert tpot_objective("gpu") == 0.05 and tpot_objective("cpu") is None
    assert tpot_objective("gpu", 0) is None and tpot_objective("cpu", 0.2) == 0.2
    fb, _ = coordinator_settings(parse_variant("codesign+coord"), coordinator_base("gpu"), 512)
    assert fb.tpot_p50_s == 0.05 and fb.batch_cap.max == 512
    assert coordinator_base("cpu").tpot_p50_s is None and coordinator_base("gpu", 0).tpot_p50_s is None


def _rec(rid, send, first, end, n=10):
    return RequestRecord(rid, "doc", send, first, end, output_tokens=n, prompt_tokens=5)


def test_a_backlog_is_charged_to_the_phase_whose_requests_waited():
    """Same traffic, two systems: one serves each phase's requests in it, the other falls behind in phase 0
    and finishes them in phase 1. The window throughput credits the latter's phase 1 with its backlog; the
    served throughput charges phase 0 and leaves phase 1 equal. A failed request adds no tokens."""
    plan = phase_plan(W5Params(duration_s=20.0, phase_s=10.0))
    kept_up = [_rec("a", 1.0, 1.5, 5.0), _rec("b", 2.0, 2.5, 8.0), _rec("c", 12.0, 12.5, 18.0)]
    behind = [_rec("a", 1.0, 9.0, 12.0), _rec("b", 2.0, 11.0, 15.0), _rec("c", 12.0, 12.5, 18.0)]
    good, late = split(kept_up, [], plan), split(behind, [], plan)
    assert late[1]["throughput_tok_s"] > good[1]["throughput_tok_s"]  # the drained backlog counts in phase 1
    assert good[0]["served_tok_s"] == pytest.approx(20 / 10)
    assert late[0]["served_tok_s"] == pytest.approx(20 / 15)
    assert late[1]["served_tok_s"] == good[1]["served_tok_s"] == pytest.approx(10 / 10)
    failed = [*kept_up[:2], RequestRecord("c", "doc", 12.0, None, None, error="rejected: full")]
    assert split(failed, [], plan)[1]["served_tok_s"] == 0.0
    # what a results file keeps reads back
    back = [RequestRecord(**r.compact()) for r in [*behind, failed[-1]]]
    assert split(back[:3], [], plan) == late and not back[3].ok and back[3].error == "rejected: full"


def test_phase_split():
    plan = phase_plan(W5Params(duration_s=20.0, phase_s=10.0))
    recs = [_rec("a", 1.0, 2.0, 4.0), _rec("b", 9.0, 12.0, 13.0), _rec("c", 15.0, 15.5, 25.0, n=30)]
    snaps = [Sample(float(t), EngineSnapshot(num_preemptions=p, batch_cap=8 + t, kv_usage=0.5))
             for t, p in ((0, 0), (5, 1), (10, 3), (20, 7), (25, 7))]
    parts = split(recs, snaps, plan)
    assert [p["requests"] for p in parts] == [2, 1]  # by phase of arrival
    assert parts[0]["throughput_tok_s"] == pytest.approx(10 / 10)  # "a" finished in [0, 10)
    assert parts[1]["end_s"] == 25.0 and parts[1]["throughput_tok_s"] == pytest.approx(40 / 15)
    # served: "a" and "b" were sent in phase 0, "b" finished at 13 s; "c" (phase 1) at 25 s
    assert parts[0]["served_span_s"] == pytest.approx(13.0)
    assert parts[0]["served_tok_s"] == pytest.approx(20 / 13)
    assert parts[1]["served_span_s"] == pytest.approx(15.0)
    assert parts[1]["served_tok_s"] == pytest.approx(30 / 15)
    assert parts[0]["ttft_p50_s"] == pytest.approx(2.0)  # TTFTs 1 and 3
    assert [p["preemptions"] for p in parts] == [3, 4]
    kinds = by_kind(recs, snaps, plan)
    assert kinds[CHAT]["preemptions"] == 3 and kinds[RAG]["requests"] == 1
    assert kinds[CHAT]["served_tok_s"] == pytest.approx(20 / 13) and kinds[RAG]["output_tokens"] == 30
    tl = timeline(snaps)
    assert tl["batch_cap"] == [8, 13, 18, 28, 33] and tl["step_token_budget"] == [None] * 5 or all(
        isinstance(x, int) for x in tl["step_token_budget"])
