"""`--namespace`: exact names and glob patterns select the InferenceServices the operator serves."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from conftest import eventually
from test_cli_variants import write_kubeconfig
from test_e2e import obj

from kvloop.operator import constants as C
from kvloop.operator.main import has_patterns, parse_args, run

ASYNC = pytest.mark.asyncio(loop_scope="session")


async def make_namespace(kube, name: str) -> None:
    rsp = await kube.post("/api/v1/namespaces",
                          json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    assert rsp.status in (200, 201), await rsp.text()


async def make_service(kube, ns: str, name: str = "chat") -> None:
    body = {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1}}
    rsp = await kube.post(f"/apis/{C.API_VERSION}/namespaces/{ns}/inferenceservices", json=body)
    assert rsp.status in (200, 201), await rsp.text()


def deployed(kube, ns: str, name: str = "chat") -> bool:
    return obj(kube, "apps/v1/deployments", name, ns) is not None


@contextlib.asynccontextmanager
async def operator_cli(kube, tmp_path, *argv: str):
    """The operator started through its command line's parse_args and run, stopped at the end."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, str(kube.url).rstrip("/"))
    args = parse_args([*argv, "--liveness=", f"--kubeconfig={kubeconfig}", "--status-interval=0.3"])
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(args, stop_flag=stop, ready_flag=ready))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, 1.0)  # see OperatorRunner.stop: kmock's open watches linger


def test_pattern_detection():
    assert not has_patterns(["team-a", "default"])
    assert all(has_patterns([p]) for p in ("team-*", "team-?", "!kube-system", "a,b"))


@ASYNC
@pytest.mark.parametrize("argv",
                         [["--namespace=team-*"], ["-n", "team-a", "-n", "team-b*"], ["-n", "!other"]],
                         ids=["glob", "exact-and-glob", "negation"])
async def test_glob_patterns_select_namespaces(kube, tmp_path, argv):
    for ns in ("team-a", "team-b", "other"):
        await make_namespace(kube, ns)
    async with operator_cli(kube, tmp_path, *argv):
        for ns in ("team-a", "team-b", "other"):
            await make_service(kube, ns)
        await eventually(lambda: deployed(kube, "team-a") and deployed(kube, "team-b"))
        await make_namespace(kube, "team-b-late")  # a namespace created later is picked up by the watch
        await make_service(kube, "team-b-late")
        await eventually(lambda: deployed(kube, "team-b-late"))
        assert not deployed(kube, "other")


@ASYNC
async def test_exact_namespace_needs_no_namespace_listing(kube, tmp_path):
    await make_namespace(kube, "team-a")
    async with operator_cli(kube, tmp_path, "--namespace=team-a"):
        await make_service(kube, "team-a")
        await make_service(kube, "other")
        await eventually(lambda: deployed(kube, "team-a"))
        assert not deployed(kube, "other")
    assert not any(r.method == "GET" and r.url.path == "/api/v1/namespaces" for r in kube._requests)
