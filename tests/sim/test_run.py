"""A tiny workload end to end, in every mode: every request completes, metrics have the bench's shape,
the KV manager's invariants hold after every step, runs are deterministic by seed, and fast-forward
gives exactly the step-by-step results."""

import json

import pytest

from kvloop.engine.bench import workloads as bw
from kvloop.engine.core.policy import policy_names

KEYS = ("output_throughput_tok_s", "request_throughput_req_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
        "itl_p99_s", "e2e_p90_s")


@pytest.mark.parametrize("mode", policy_names())
def test_smoke_end_to_end(simulate, mode):
    sim, res = simulate(mode, check_integrity_every=1)
    c, s = res["client"], res["server"]
    assert c["completed"] == bw.w1_smoke().num_requests and c["failed"] == 0
    for k in KEYS:
        assert c[k] > 0
    assert c["total_output_tokens"] == bw.w1_smoke().output_tokens
    assert s["available"] and s["kv_use_series"]
    for k in ("hit_rate_device", "hit_rate_host", "preemptions", "oom_events", "kv_use_mean"):
        assert k in s
    if mode in ("continuous+lru", "codesign"):
        assert s["hit_rate_total"] > 0  # shared documents and system prompt
    else:
        assert not s["hit_rate_total"]
    assert res["sim"]["unfinished"] == 0
    sim.scheduler.check_integrity()
    assert sim.kv.num_referenced_blocks == 0


def test_deterministic_by_seed(simulate):
    a = json.dumps(simulate(seed=1)[1], sort_keys=True, default=str)
    b = json.dumps(simulate(seed=1)[1], sort_keys=True, default=str)
    c = json.dumps(simulate(seed=2)[1], sort_keys=True, default=str)
    assert a == b
    assert a != c


@pytest.mark.parametrize("profile", ["cpu", "h200"])
@pytest.mark.parametrize("mode", policy_names())
def test_fast_forward_is_exact(simulate, mode, profile, monkeypatch):
    from kvloop.engine.sim import fastforward
    from kvloop.engine.sim.profiles import get_profile

    prof = get_profile(profile, calibration="/nonexistent")
    wl = bw.w1(0.25, num_doc_questions=12, num_sessions=3, rate=2.0)
    finished_in_windows = []
    orig = fastforward.FastForward._window

    def spy(self):
        def ended():
            return sum(r.end_s is not None for r in self.sim.rec.records.values())
        before = ended()
        out = orig(self)
        finished_in_windows.append(ended() - before)
        return out

    monkeypatch.setattr(fastforward.FastForward, "_window", spy)
    _, fast = simulate(mode, wl=wl, fast_forward=True, profile=prof)
    monkeypatch.undo()
    _, slow = simulate(mode, wl=bw.w1(0.25, num_doc_questions=12, num_sessions=3, rate=2.0),
                       fast_forward=False,
                       profile=prof)
    assert sum(finished_in_windows) > 0  # windows ran through to requests' last tokens
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    # the ITL mean sums the same gaps in another order (last-bit float differences)
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert fast["client"] == slow["client"]
    assert fast["server"] == slow["server"]


@pytest.mark.parametrize(("mode", "factor"), [(m, 1.0) for m in policy_names()] + [("codesign", 2.0)])
def test_fast_forward_is_exact_at_the_batch_cap(simulate, mode, factor, monkeypatch):
    """A cap of 3 with requests arriving faster than they finish: windows take arrivals into the queue.
    With codesign's priced room past the cap (factor 2), windows end where the scheduler may admit."""
    from kvloop.engine.sim import fastforward
    from kvloop.engine.sim.modes import Sizing

    sizing = Sizing(kv_cache_tokens=3072, host_cache_tokens=8192, disk_cache_tokens=32768, max_num_seqs=3,
                    max_num_batched_tokens=256, static_batch=3, cascade_cap_factor=factor)

    def wl():
        return bw.w1(0.25, num_doc_questions=12, num_sessions=3, rate=4.0)

    _, slow = simulate(mode, wl=wl(), sizing=sizing, fast_forward=False)
    taken = []
    orig = fastforward.FastForward._window

    def spy(self):
        before = len(self.sim.rec.records)  # one record per request sent (the heap also gains follow-ups)
        out = orig(self)
        taken.append(len(self.sim.rec.records) - before)
        return out

    monkeypatch.setattr(fastforward.FastForward, "_window", spy)
    _, fast = simulate(mode, wl=wl(), sizing=sizing, fast_forward=True)
    assert taken and (sum(taken) > 0 or factor > 1)  # windows ran (at the cap: taking arrivals in)
    assert fast["sim"]["steps"] == slow["sim"]["steps"]
    assert fast["client"].pop("itl_mean_s") == pytest.approx(slow["client"].pop("itl_mean_s"), rel=1e-12)
    assert fast["client"] == slow["client"]
    assert fast["server"] == slow["server"]


def test_static_batches(simulate):
    sim, res = simulate("static")
    batches = sim.scheduler.static.batches
    assert max(batches) <= 4 and sum(batches) == bw.w1_smoke().num_requests
    assert res["sim"]["static_batches"] == len(batches)


def test_trace_replay(simulate, tmp_path):
    from kvloop.engine.bench.traces import read_azure_csv

    p = tmp_path / "t.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,300,10\n0.5,120,5\n1.25,800,20\n")
    _, res = simulate("continuous", wl=read_azure_csv(p))
    assert res["client"]["completed"] == 3 and res["client"]["total_output_tokens"] == 35


def test_rejection_counted(simulate):
    wl = bw.Workload("big", requests=[bw.RequestSpec("r0", "doc", 0.0, list(range(100, 5100)), 4)])
    _, res = simulate("continuous", wl=wl)
    assert res["client"]["rejections"] == 1 and res["client"]["completed"] == 0


def test_static_oom_fails_requests(simulate):
    from kvloop.engine.sim.modes import Sizing

    sizing = Sizing(kv_cache_tokens=512, max_num_seqs=16, max_num_batched_tokens=256, static_batch=4)
    _, res = simulate("static", sizing=sizing)
    c, s = res["client"], res["server"]
    assert s["oom_events"] > 0
    assert c["failed"] == s["oom_events"] and c["completed"] > 0
    assert res["sim"]["unfinished"] == 0
