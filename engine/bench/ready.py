"""Waiting for a server process to answer its readiness endpoint (benchmarks start real servers)."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float = 300.0, what: str = "the server") -> None:
    """Returns once GET url answers 200; raises with the process's last output if it exits first, and
    kills it if the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"{what} exited ({proc.returncode}) {tail}".rstrip())
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"{what} did not become ready in {timeout_s:.0f} s")
