"""A restart that comes back warm: real `kvloop serve --config` processes with the disk tier on, a real
SIGTERM, exit code 0 within the grace period, block files on disk, and a restarted server that serves the
same prompt from the disk tier with the same greedy fp32 output. Also TERM during a streaming request:
/ready and new requests answer 503 at once, the stream ends cleanly, the process exits in time. Both engine
backends: with the core in its own process, the flush runs there before it stops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

BLOCK = 16
DOC = " ".join(f"Paragraph {i}: the tier mover copies block {i * 7 % 31} to slot {i * 3 % 17}."
               for i in range(24))
PROMPT = DOC + "\nSummary:"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(tmp_path: Path, disk: Path) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text("dtype: float32\nmax_model_len: 1024\nkv_cache:\n  device_pool_mib: 48\n  "
                    "host_pool_mib: 48\n"
                    f"  disk_dir: {disk}\n")
    return path


@contextmanager
def serving(settings: Path, grace: float, log: Path, backend: str):
    """A `kvloop serve` process on 127.0.0.1, ready; yields (process, base url). Killed if still alive."""
    port = _free_port()
    kvloop = Path(sys.executable).with_name("kvloop")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(kvloop), "serve", "--config", str(settings), "--host", "127.0.0.1",
                                 "--port", str(port), "--shutdown-grace", str(grace), "--log-level", "info",
                                 "--engine-backend", backend],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (f"kvloop serve exited with {proc.returncode}: "
                                         f"{log.read_text()[-2000:]}")
            assert time.monotonic() < end, "kvloop serve not ready after 90 s"
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def _complete(client: openai.OpenAI):
    return client.completions.create(model="default", prompt=PROMPT, max_tokens=8, temperature=0)


def _term_and_wait(proc: subprocess.Popen, within: float) -> float:
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=within) == 0
    return time.monotonic() - start


BACKENDS = pytest.mark.parametrize("backend", ["process", "thread"])


@BACKENDS
def test_term_flushes_the_cache_and_a_restart_serves_it_from_disk(tmp_path, backend):
    disk = tmp_path / "kv"
    settings = _settings(tmp_path, disk)
    log = tmp_path / "serve.log"
    grace = 10.0
    with serving(settings, grace, log, backend) as (proc, url):
        cold = _complete(_client(url))
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert _term_and_wait(proc, grace + 10) < grace  # nothing in flight: the flush alone
    full_blocks = (cold.usage.prompt_tokens - 1) // BLOCK  # the last prompt token is always computed
    assert full_blocks >= 16
    # one request left its blocks below the disk tier's gate: only the flush on TERM wrote them
    assert len(list(disk.glob("*.kvb"))) >= full_blocks
    assert not list(disk.glob("*.tmp"))

    with serving(settings, grace, log, backend) as (proc, url):
        warm = _complete(_client(url))
        stats = httpx.get(url + "/metrics").text
        _term_and_wait(proc, grace + 10)
    assert warm.usage.prompt_tokens_details.cached_tokens == full_blocks * BLOCK, log.read_text()[-3000:]
    assert warm.choices[0].text == cold.choices[0].text  # K/V read back from disk give the cold run's tokens
    disk_hits = [line for line in stats.splitlines()
                 if line.startswith("kvloop:prefix_cache_hits_total{") and 'tier="disk"' in line]
    assert disk_hits and float(disk_hits[0].split()[-1]) == full_blocks * BLOCK  # the hit came from disk


@BACKENDS
def test_term_during_a_stream_stops_admitting_and_ends_the_stream_within_the_grace(tmp_path, backend):
    settings = _settings(tmp_path, tmp_path / "kv")
    log = tmp_path / "serve.log"
    grace = 3.0
    with serving(settings, grace, log, backend) as (proc, url):
        client = _client(url)
        stream = client.completions.create(model="default", prompt="Count: one two three", max_tokens=900,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)  # in flight: generating
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        while (ready := httpx.get(url + "/ready", timeout=2)).status_code == 200:  # the signal lands async
            assert time.monotonic() < end, "/ready still 200 five seconds after TERM"
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "shutting_down"
        assert int(ready.headers["retry-after"]) >= 1
        with pytest.raises(openai.APIStatusError) as rejected:
            _complete(client)
        assert rejected.value.status_code == 503
        assert rejected.value.response.headers.get("retry-after")
        assert rejected.value.body["code"] == "shutting_down"
        with pytest.raises(openai.APIError, match="shutting down"):  # 900 tokens outlast the grace
            for _ in chunks:
                pass
        assert time.monotonic() - start < grace + 1
        assert proc.wait(timeout=grace + 10) == 0
    assert time.monotonic() - start < grace + 6
    assert "drained" in log.read_text()
