"""The last chat session's chain: which session bounds a run's makespan, and how its span splits."""

from kvloop.engine.bench import report
from kvloop.engine.bench.chains import last_chain, session_of
from kvloop.engine.bench.metrics import RequestRecord, client_metrics


def _rec(rid: str, kind: str, send: float, ttft: float, decode: float, tokens: int = 11,
         error: str | None = None) -> RequestRecord:
    first = send + ttft
    return RequestRecord(rid, kind, send, first, first + decode, output_tokens=tokens, error=error)


def test_session_ids():
    assert session_of("c13-t2") == ("c13", 2)
    assert session_of("q4") is None and session_of("-t1") is None and session_of("c1-tx") is None


def test_the_session_that_finished_last_with_its_turns_and_gaps():
    records = [
        _rec("q0", "doc", 10.0, 0.5, 2.0),  # the run starts at 10
        _rec("c1-t1", "chat", 16.0, 0.5, 2.0),  # c1: ends 18.5
        _rec("c1-t0", "chat", 11.0, 1.0, 3.0),
        _rec("c2-t0", "chat", 12.0, 0.25, 5.0),  # c2: ends 12 + 0.25 + 5 = 17.25, then 18 + 0.5 + 1 = 19.5
        _rec("c2-t1", "chat", 18.0, 0.5, 1.0),
        _rec("q1", "doc", 13.0, 0.5, 9.0),  # the last finish (22.5), but not a session
    ]
    chain = last_chain(records)
    assert chain is not None and chain.session == "c2"
    assert chain.makespan_s == 12.5 and chain.end_s == 9.5
    assert [t.send_s for t in chain.turns] == [2.0, 8.0]  # turn order, from the first send of the run
    assert chain.think_s == 8.0 - 7.25
    assert chain.turns[0].ms_per_token == 500.0  # 5 s over the 10 tokens after the first
    d = chain.as_dict()
    assert d["decode_s"] == [5.0, 1.0] and d["ttft_s"] == [0.25, 0.5] and d["first_send_s"] == 2.0


def test_a_session_with_a_failed_turn_is_no_chain():
    records = [_rec("c1-t0", "chat", 0.0, 1.0, 1.0), _rec("c2-t0", "chat", 0.0, 1.0, 5.0, error="timeout")]
    assert last_chain(records).session == "c1"
    # the makespan is the report's (duration_s): up to the last successful finish, not the failed turn's end
    assert last_chain(records).makespan_s == 2.0 == client_metrics(records)["duration_s"]
    assert last_chain(records[1:]) is None and last_chain([]) is None
    assert last_chain([_rec("q0", "doc", 0.0, 1.0, 1.0)]) is None


def test_the_report_shows_chains_at_the_main_rate_only():
    chain = last_chain([_rec("c7-t0", "chat", 0.0, 0.5, 4.0), _rec("c7-t1", "chat", 6.0, 0.5, 2.0)]).as_dict()
    runs = [{"rate": 4.0, "rep": 0, "last_chain": chain}, {"rate": 2.0, "rep": 0, "last_chain": chain}]
    rep = {"meta": {"main_rate": 4.0}, "systems": {"codesign": {"runs": runs}}}
    lines = report.chain_lines(rep)
    rows = [x for x in lines if x.startswith("| codesign")]
    assert len(rows) == 1 and "| c7 |" in rows[0] and "4.0 / 2.0" in rows[0]
    assert report.chain_lines({"meta": {"main_rate": 4.0}, "systems": {"codesign": {"runs": runs[:0]}}}) == []
