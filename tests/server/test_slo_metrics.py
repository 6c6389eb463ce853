"""kvloop:slo_good_total and kvloop:slo_missed_total{reason} through a real server, on both engine
backends: the counts agree with the SLO the flags set, the warm-up request is not counted, and a request a
stop string ends in the API process (the process backend) is judged like any other finish."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvloop.engine.cli import build_parser, engine_config_from_args
from kvloop.engine.core.slo import MISS_REASONS, Slo
from kvloop.engine.engine_core import EngineCore
from kvloop.engine.server.launch import ENGINE_BACKENDS, build_process_server, build_server

from .conftest import _serve_args, engine_config, serve_ready

# TTFT allowed: a microsecond, whatever the prompt; TPOT: a minute. Every request misses on TTFT.
TINY_TTFT_FLAGS = ["--slo-ttft-s", "1e-6", "--slo-ttft-per-1k-s", "0", "--slo-tpot-s", "60"]
GENEROUS = Slo(60.0, 0.0, 60.0)
TINY_TPOT = Slo(60.0, 0.0, 1e-6)


def set_slo(engine, slo: Slo) -> None:
    """Runs in the engine (a partial of it pickles to the core process): the SLO the next finishes are
    judged by; the counts so far stay."""
    engine.scheduler.slo_ledger.slo = slo


def counts(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    out = {"good": sum(s.value for s in fams["kvloop:slo_good"].samples)}
    out.update({s.labels["reason"]: s.value for s in fams["kvloop:slo_missed"].samples})
    return out


def wait_counts(http: httpx.Client, expected: dict[str, float], timeout: float = 15.0) -> None:
    """Until /metrics shows these counts (the snapshot reaches the API process within an idle tick)."""
    end = time.monotonic() + timeout
    while (seen := counts(http)) != expected and time.monotonic() < end:
        time.sleep(0.05)
    assert seen == expected


@pytest.fixture(scope="module", params=ENGINE_BACKENDS)
def slo_server(request, checkpoint, fp32_model, tokenizer) -> Iterator[tuple[httpx.Client, object]]:
    flags = engine_config_from_args(build_parser().parse_args(["serve", *TINY_TTFT_FLAGS])).scheduler
    config = engine_config()
    config.scheduler.slo_ttft_s = flags.slo_ttft_s
    config.scheduler.slo_ttft_per_1k_s = flags.slo_ttft_per_1k_s
    config.scheduler.slo_tpot_s = flags.slo_tpot_s
    args = _serve_args()
    if request.param == "process":
        app, async_engine = build_process_server(config, args, tokenizer=tokenizer)
    else:
        engine = EngineCore(config, model=fp32_model, tokenizer=tokenizer, fingerprint=checkpoint.fingerprint,
                            model_name=checkpoint.name)
        app, async_engine = build_server(engine, args)
    async_engine.exit_on_death = False
    with serve_ready(app, args) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        yield http, async_engine


def complete(http: httpx.Client, **body) -> dict:
    resp = http.post("/v1/completions", json={"model": "default", "prompt": "The sky is", "temperature": 0,
                                              "ignore_eos": True, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def test_slo_counts_follow_the_slo(slo_server):
    http, async_engine = slo_server
    expected = {"good": 0.0, **{r: 0.0 for r in MISS_REASONS}}
    wait_counts(http, expected)  # the warm-up request is out of the books

    for _ in range(3):  # the flags' SLO: a microsecond to the first token
        complete(http, max_tokens=2)
    expected["ttft"] += 3
    wait_counts(http, expected)

    async_engine.call_in_engine(functools.partial(set_slo, slo=GENEROUS)).result(timeout=30)
    free = complete(http, max_tokens=8)["text"]
    stop = free[3:5]
    assert len(stop) == 2, free
    # a stop string: the process backend's API process ends the request, the core hears of it after
    stopped = complete(http, max_tokens=64, stop=[stop])
    assert stopped["finish_reason"] == "stop" and stopped["text"] == free[: free.index(stop)], stopped
    expected["good"] += 2
    wait_counts(http, expected)

    async_engine.call_in_engine(functools.partial(set_slo, slo=TINY_TPOT)).result(timeout=30)
    complete(http, max_tokens=4)  # decode time to judge: a microsecond per token is missed
    complete(http, max_tokens=1)  # one token: no TPOT, the TTFT alone judges it
    expected["tpot"] += 1
    expected["good"] += 1
    wait_counts(http, expected)
