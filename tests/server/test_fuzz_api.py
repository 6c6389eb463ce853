"""Property-based fuzzing of the parameter values the engine consumes (bench/fuzz_api.py generates them)
against the live server: no 5xx, no server error inside a stream, the engine never stops, and a greedy
request gets the same answer after the run as before. Bounded for CI (FUZZ_EXAMPLES cases, a few tokens
each); KVLOOP_FUZZ_EXAMPLES raises it, and `make fuzz` runs it for minutes against `kvloop serve`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

FUZZ_EXAMPLES = int(os.environ.get("KVLOOP_FUZZ_EXAMPLES", "100"))


def _load_fuzz_module():
    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz_api.py"
    spec = importlib.util.spec_from_file_location("kvloop_bench_fuzz_api", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fuzz_api = _load_fuzz_module()


def test_fuzzed_requests_never_stop_the_engine(server, http):
    before = fuzz_api.greedy(http)
    tally = fuzz_api.Tally()
    fuzz_api.fuzz(http, tally, FUZZ_EXAMPLES, seed=0, strict=True)
    assert tally.cases >= FUZZ_EXAMPLES * 0.9, tally.summary()
    assert not tally.server_errors and not any(code >= 500 for code in tally.statuses), tally.summary()
    assert tally.statuses[200] >= 10 and tally.statuses[400] >= 10, tally.summary()  # it reached both sides
    assert http.get("/health").status_code == 200
    assert server.async_engine.dead is None and server.async_engine._thread.is_alive()
    assert fuzz_api.greedy(http) == before
    server.assert_no_leak()
