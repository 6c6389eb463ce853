"""scripts/serve_fleet.sh refuses what it cannot run before it starts anything (a fleet end to end loads a
model per pod: it is run by hand, see README's "Several replicas behind a router")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_fleet.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_an_unknown_option_is_refused():
    r = run("--bogus")
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr


def test_a_missing_router_is_named():
    r = run("--pods", "1", ROUTER="/nonexistent/vllm-router")
    assert r.returncode == 2 and "vllm-router" in r.stderr


def test_kv_aware_needs_the_engines_event_flag(tmp_path):
    fake = tmp_path / "kvloop"  # a kvloop whose serve --help has no --kv-events-endpoint
    fake.write_text("#!/usr/bin/env bash\necho 'usage: kvloop serve [--port PORT]'\n")
    fake.chmod(0o755)
    r = run("--policy", "kv_aware", KVLOOP=str(fake), ROUTER="/bin/true")
    assert r.returncode == 2 and "--kv-events-endpoint" in r.stderr
