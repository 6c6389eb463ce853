"""CI smoke run of the harness (WORKLOADS.md's W1-smoke): against the in-process engine through
`kvloop bench` (report files included) and against a live `kvloop serve` on 127.0.0.1. It checks that
the harness runs and every metric is produced, not how fast anything is."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from kvloop.engine.bench.driver import run_workload
from kvloop.engine.bench.metrics import client_metrics, server_metrics
from kvloop.engine.bench.targets.http import HTTPTarget
from kvloop.engine.bench.workloads import SMOKE, build_w1
from kvloop.engine.cli import main

LATENCIES = [f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")]
CLIENT = ["completed", "failed", "rejections", "duration_s", "request_throughput_req_s",
          "output_throughput_tok_s",
          "total_token_throughput_tok_s", "goodput_req_s", "meets_slo", *LATENCIES]
# 128-token documents, 8-token answers
SMALL = ["--scale", "0.5", "--rate", "20", "--think", "0.05", "--threads", "1"]


def _check_client(m: dict, n: int) -> None:
    assert m["completed"] == n and m["failed"] == 0, m
    for k in CLIENT:
        assert k in m and not (isinstance(m[k], float) and math.isnan(m[k])), k
    assert m["output_throughput_tok_s"] > 0 and m["ttft_p99_s"] > 0


def test_smoke_in_process(tmp_path):
    rc = main(["bench", "--workload", "w1-smoke", "--systems", "codesign,static", *SMALL, "--no-progress",
               "--out", str(tmp_path), "--name", "smoke"])
    assert rc == 0
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert set(report["systems"]) == {"codesign", "static"}
    for d in report["systems"].values():
        for k in ("throughput_tok_s", "ttft_p99_s", "tpot_p99_s", "oom_events", "capacity_req_s",
                  "preemptions",
                  "kv_use_mean", "hit_rate_device", "hit_rate_host", "noise_other_cores_mean"):
            assert k in d, k
        assert d["throughput_tok_s"] > 0 and d["failed"] == 0 and d["oom_events"] is not None
        run = d["runs"][0]
        _check_client(run["client"], 12)
        assert run["noise"]["samples"] >= 1
        chain = run["last_chain"]  # W1-smoke's 3 sessions of 2 turns: the one that finished last
        assert len(chain["decode_s"]) == 2 and chain["end_s"] <= chain["makespan_s"] + 1e-3
    cd = report["systems"]["codesign"]
    # shared documents and system prompt
    assert cd["hit_rate_device"] is not None and cd["hit_rate_total"] > 0
    assert cd["hit_rate_host"] is not None  # codesign has a host tier
    assert report["ratios"]["static"]["throughput_x"] > 0 and report["subject"] == "codesign"
    md = (tmp_path / "smoke.md").read_text()
    assert "| codesign |" in md and "kvloop bench" in md  # the table and the exact command
    assert "## The last chat session of each run" in md
    for png in report["plots"]:
        assert (tmp_path / png).stat().st_size > 1000
    # a second subject judged afterwards from the report's own numbers: goals and
    # ratios for both, the run kept
    assert main(["bench", "--rejudge", str(tmp_path / "smoke.json"), "--subject", "codesign,static"]) == 0
    judged = json.loads((tmp_path / "smoke.json").read_text())
    assert judged["systems"] == report["systems"] and judged["ratios"] == report["ratios"]
    assert judged["subject"] == "codesign" and set(judged["ratios_by_subject"]) == {"codesign", "static"}
    assert judged["ratios_by_subject"]["static"]["codesign"]["throughput_x"] == pytest.approx(
        1 / report["ratios"]["static"]["throughput_x"])
    names = [g["name"] for g in judged["goals"]]
    assert names[: len(report["goals"])] == [g["name"] for g in report["goals"]]
    assert "static oom_events" in names and "static throughput / codesign" not in names  # GOALS' systems only
    assert not [n for n in names if n.startswith("static") and n.endswith("/ static")]  # nor against itself
    assert judged["meta"]["commands"][-1].startswith("kvloop bench --subject codesign,static --rejudge")
    md = (tmp_path / "smoke.md").read_text()
    assert "## Ratios (codesign / system)" in md and "## Ratios (static / system)" in md
    with pytest.raises(SystemExit, match="--subject 'codesign@tpot80' is not one of"):
        main(["bench", "--rejudge", str(tmp_path / "smoke.json"), "--subject", "codesign,codesign@tpot80"])
    assert json.loads((tmp_path / "smoke.json").read_text()) == judged  # refused before anything is written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_server():
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "kvloop.engine.cli", "serve", "--host", "127.0.0.1",
                             "--port",
                             str(port), "--kv-cache-tokens", "3072", "--threads", "1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, "kvloop serve exited"
            try:
                # /ready, not /health: the server is alive before its engine has started, and a request
                # sent in between is answered 503 not_ready (a "rejection" in the results)
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("kvloop serve was not ready within 120 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def test_smoke_live_server(live_server):
    wl = build_w1(replace(SMOKE.scaled(0.5), rate=20.0, think_mean_s=0.05))
    target = HTTPTarget(live_server, "kvloop-http")
    try:
        res = run_workload(wl, target, sample_every_s=0.2)
    finally:
        target.close()
    assert not [r.error for r in res.records if r.error], "failed requests"
    _check_client(client_metrics(res.records), wl.num_requests)
    assert all(r.output_tokens == 8 and r.prompt_tokens > 0 for r in res.records)
    srv = server_metrics(res.samples)
    assert srv["available"] and srv["kv_use_series"] and srv["hit_rate_device"] is not None
    assert srv["preemptions"] is not None and srv["oom_events"] is not None
    assert sum(r.cached_tokens for r in res.records) > 0  # usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("subject", ["codesign@tpot80", "codesign,codesign@tpot80"])
def test_a_subject_that_does_not_run_is_refused_before_any_run(tmp_path, subject):
    with pytest.raises(SystemExit, match="--subject 'codesign@tpot80' is not one of --systems"):
        main(["bench", "--workload", "w1-smoke", "--systems", "static,codesign", "--subject", subject,
              "--no-progress", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())
