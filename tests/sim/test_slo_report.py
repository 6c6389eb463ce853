"""A simulated run judged by the SLO of its profile's scale: good, missed by reason, refusals by the
scheduler's reason and other failures apart, percentiles of the finished requests."""

from __future__ import annotations

import pytest

from kvloop.engine.bench.metrics import RequestRecord
from kvloop.engine.core.slo import CPU_SLO, GPU_SLO
from kvloop.engine.sim.slo_report import rejection_reason, slo_for, slo_report


def rec(rid, send, first=None, end=None, out=10, prompt=1000, cached=0, error=None):
    return RequestRecord(rid, "t", send, first, end, prompt_tokens=prompt, output_tokens=out,
                         cached_tokens=cached, error=error)


def test_slo_of_the_profiles_scale():
    assert slo_for("cpu") is CPU_SLO
    assert slo_for("h200") is GPU_SLO and slo_for("h200-70b-fp8") is GPU_SLO


def test_rejection_reason():
    assert rejection_reason("rejected: too_long: this model's maximum context length is 8") == "too_long"
    assert rejection_reason("rejected: queue_full: 1024 requests are waiting") == "queue_full"
    assert rejection_reason("unfinished") is None


def test_report_counts_each_request_once():
    records = [
        rec("good", 0.0, 0.5, 1.4, cached=500),  # TTFT 0.5 s <= 1.2 s, TPOT 0.1 s
        rec("slow-first", 1.0, 3.0, 3.9),  # TTFT 2 s > 1 + 0.2 s
        rec("slow-decode", 2.0, 2.1, 4.1),  # TPOT 0.22 s > 0.1 s
        rec("refused", 3.0, error="rejected: queue_full: 1024 requests are waiting"),
        rec("long", 3.5, error="rejected: too_long: the request does not fit"),
        rec("cut", 4.0, error="unfinished"),
    ]
    r = slo_report(records, GPU_SLO)
    assert r["slo_good"] == 1 and r["slo_sent"] == 6
    assert r["slo_missed"] == {"ttft": 1, "tpot": 1, "failed": 3}
    assert r["rejections"] == {"queue_full": 1, "too_long": 1} and r["failures"] == {"unfinished": 1}
    assert r["slo_goodput_req_s"] == pytest.approx(1 / 4.1)  # first send 0, last finish 4.1
    assert r["ttft_p50_s"] == pytest.approx(0.5) and r["ttft_p99_s"] == pytest.approx(2.0, rel=0.02)
    assert r["slo_nohit_count"] == 2 and r["slo_nohit_ttft_p99_s"] == pytest.approx(2.0, rel=0.02)
    assert r["tpot_p50_s"] == pytest.approx(0.1)
    assert r["slo"]["tpot_s"] == GPU_SLO.tpot_s
