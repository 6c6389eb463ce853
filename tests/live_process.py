"""A live process for a test (a `kvloop serve`, a router): started with its output in a log file, awaited
until a URL answers 200, stopped (TERM, then KILL) however the test ends."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def router_binary() -> str | None:
    """vllm-router beside this Python (the dev extras install it there) or on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    return str(beside) if beside.exists() else shutil.which("vllm-router")


@contextmanager
def running(args: list[str], log: Path, ready_url: str, what: str, env: dict | None = None,
            ready_s: float = 120.0, stop_s: float = 20.0) -> Iterator[subprocess.Popen]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            assert proc.poll() is None, f"{what} exited: {log.read_text(errors='replace')[-2000:]}"
            assert time.monotonic() < deadline, f"{what} not ready after {ready_s:.0f} s"
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
