"""call_in_engine across the process boundary: results, exceptions and refusals reach the caller, and the
engine core goes on serving. (On the thread backend the same calls run in the engine thread.)"""

from __future__ import annotations

import pickle

import pytest


def _raise(e) -> None:
    raise KeyError("from the engine")


def _num_blocks(e) -> int:
    return e.config.num_blocks


def _unpicklable_result(e):
    return lambda: None


def test_results_and_exceptions_reach_the_caller(server, http):
    assert server.in_engine(_num_blocks) == server.engine.config.num_blocks
    with pytest.raises(KeyError, match="from the engine"):
        server.in_engine(_raise)
    assert http.get("/health").status_code == 200


def test_what_does_not_pickle_fails_the_call_not_the_engine(server, http):
    if server.async_engine.__class__.__name__ != "ProcessAsyncEngine":
        pytest.skip("only the process backend pickles calls")
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        server.in_engine(lambda e: e.config.num_blocks)  # a lambda does not pickle
    with pytest.raises(RuntimeError):
        server.in_engine(_unpicklable_result)
    assert server.in_engine(_num_blocks) == server.engine.config.num_blocks
    resp = http.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 2})
    assert resp.status_code == 200 and http.get("/health").status_code == 200
