"""A client that goes away aborts its requests: no block stays referenced, integrity holds."""

from __future__ import annotations

import httpx

from .test_errors import CHAT, COMP, chat, comp


def test_stream_dropped_mid_way_frees_blocks(server):
    body = chat(max_tokens=300, stream=True, temperature=0, n=2)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", CHAT, json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for _ in range(6):  # role chunks and a few tokens
                next(lines)
            assert server.async_engine.num_in_flight == 2
        # leaving the block closes the half-read connection
    server.assert_no_leak()


def test_non_streaming_client_timeout_aborts(server):
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=1.0)) as client:
        try:
            client.post(COMP, json=comp(prompt="Write an essay.", max_tokens=400, temperature=0))
        except httpx.ReadTimeout:
            pass
        else:
            raise AssertionError("expected the request to outlast the client's read timeout")
    server.assert_no_leak()
    assert server.async_engine.num_in_flight == 0


def test_deadline_aborts_and_answers_408(server, http):
    settings = server.app.state.settings
    old = settings.request_timeout_s
    settings.request_timeout_s = 0.3
    try:
        resp = http.post(COMP,
                         json=comp(prompt="Write an essay.", max_tokens=400, temperature=0, ignore_eos=True))
        assert resp.status_code == 408, resp.text
        assert resp.json()["error"]["code"] == "timeout"
    finally:
        settings.request_timeout_s = old
    server.assert_no_leak()
