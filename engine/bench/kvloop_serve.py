"""`kvloop serve` as a benchmark target: our own server started like a peer's (bench.systems), so kvloop
and the peers go through the same HTTP client, readiness wait and shutdown."""

from __future__ import annotations

import sys

from kvloop.engine.bench.systems import ServerProcessTarget, _free_port


class KvloopServeTarget(ServerProcessTarget):
    """`kvloop serve` on 127.0.0.1 with `args` (e.g. --dtype float32 --quantization int8)."""

    health_path = "/ready"  # /health answers before the engine has loaded; /ready once it serves
    start_timeout_s = 600.0  # load + any compile at start-up

    def __init__(self, name: str, args: list[str], threads: int | None = None):
        port = _free_port()
        cmd = [sys.executable, "-m", "kvloop.engine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning", *(["--threads", str(threads)] if threads else []), *args]
        super().__init__(name, cmd, port, flavor="openai")
        self.args = args

    def info(self) -> dict:
        return {"impl": "kvloop serve", "args": self.args, **super().info()}
