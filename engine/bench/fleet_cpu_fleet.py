"""`bench/fleet_cpu.py`'s fleets: scripts/serve_fleet.sh started as it is (N pods + router [+ store]), with
--keep-going so that a pod or the store killed on purpose leaves the rest serving. The pods' and the store's
pids come from the script's own log lines; the pods' and the router's counters from their /metrics."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvloop.engine.bench.targets.http import parse_prometheus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "serve_fleet.sh"
# A dead pod leaves the rotation at the router's next health check: checked every second, one failure
# (vllm-router's default is 60 s and 3 failures, a rotation far slower than the 5 s the bench asks of it).
ROUTER_ARGS = "--health-check-interval-secs 1 --health-failure-threshold 1 --health-check-timeout-secs 1"
READY_TIMEOUT_S = 600.0


def missing_tools() -> str | None:
    """Why a live fleet cannot run here, or None."""
    router = ROOT / ".venv" / "bin" / "vllm-router"
    if not router.exists() and not shutil.which("vllm-router"):
        return "vllm-router is not installed"
    if not shutil.which("redis-server"):
        return "redis-server is not installed"
    return None


def _free_block(n: int) -> int:
    """A base port with n free ports above it and their +1000/+2000/+3000 companions (the script's layout)."""
    import socket

    for base in range(20000 + (os.getpid() % 200) * 40, 60000, 40):
        ports = [base + d + i for d in (0, 1000, 2000, 3000) for i in range(n)] + [base + 30, base + 31]
        try:
            socks = []
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free port block")


def prom_sum(metrics: dict[str, float], name: str, label: str = "") -> float:
    """The sum of a metric's series (by name, before the labels), those whose labels contain `label`."""
    return sum(v for k, v in metrics.items() if k.split("{")[0] == name and label in k)


@dataclass
class Fleet:
    pods: int
    policy: str = "round_robin"
    store: bool = False
    serve_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    base_port: int = 0
    log_path: Path | None = None

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.base_port + 30}"

    @property
    def router_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.base_port + 31}/metrics"

    def pod_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.base_port + i}"

    def start(self) -> Fleet:
        self.base_port = _free_block(self.pods)
        fd, name = tempfile.mkstemp(prefix=f"fleet_cpu_{self.policy}_", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        cmd = [
            "bash",
            str(SCRIPT),
            "--pods",
            str(self.pods),
            "--base-port",
            str(self.base_port),
            "--router-port",
            str(self.base_port + 30),
            "--policy",
            self.policy,
            "--keep-going",
            *(["--store"] if self.store else []),
            "--",
            *self.serve_args,
        ]
        env = {
            **os.environ,
            "ROUTER_ARGS": ROUTER_ARGS,
            "READY_TIMEOUT": str(int(READY_TIMEOUT_S)),
            "SHUTDOWN_GRACE": "2",
        }
        with open(self.log_path, "w") as log:
            # its own session: the script's children go with it if it must be killed outright
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve_fleet.sh exited ({self.proc.returncode}); log {self.log_path}")
            if "router (" in self.log():
                try:
                    if httpx.get(self.router_url + "/v1/models", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"fleet not ready after {READY_TIMEOUT_S:g} s; log {self.log_path}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def engine_pid(self, i: int) -> int:
        """The i-th pod's `kvloop serve` pid, as serve_pod.sh printed it."""
        m = re.search(rf"engine pid (\d+) on 127\.0\.0\.1:{self.base_port + i}\b", self.log())
        if not m:
            raise RuntimeError(f"pod {i}'s pid not in {self.log_path}")
        return int(m.group(1))

    def store_pid(self) -> int:
        m = re.search(r"serve_fleet: store pid (\d+)", self.log())
        if not m:
            raise RuntimeError(f"the store's pid not in {self.log_path}")
        return int(m.group(1))

    def pod_metrics(self, i: int) -> dict[str, float] | None:
        try:
            return parse_prometheus(httpx.get(self.pod_url(i) + "/metrics", timeout=5).text)
        except httpx.HTTPError:
            return None

    def hits_queries(self) -> list[tuple[float, float] | None]:
        """Per pod: (prompt tokens hit in its prefix cache, any tier; prompt tokens looked up)."""
        out = []
        for i in range(self.pods):
            m = self.pod_metrics(i)
            out.append(
                None
                if m is None
                else (
                    prom_sum(m, "vllm:prefix_cache_hits_total"),
                    prom_sum(m, "vllm:prefix_cache_queries_total"),
                )
            )
        return out

    def router_metrics(self) -> dict[str, float]:
        try:
            return parse_prometheus(httpx.get(self.router_metrics_url, timeout=2).text)
        except httpx.HTTPError:
            return {}

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the script stops router, pods, store in that order
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.returncode == 0 and self.log_path:  # a clean stop: its log has nothing to tell
            self.log_path.unlink(missing_ok=True)
        self.proc = None
