"""The operator's command line, exactly as every rendered install runs it, against the fake API server.

Every Helm value set (helm 3 and 4) and every kustomize overlay renders a Deployment whose container
runs `kvloop operator …`. Each distinct command line (and env) runs here as a real subprocess with
the `kvloop` console script, a kubeconfig for the fake API server, and the liveness address moved to
a free 127.0.0.1 port (nothing else changed), until its liveness endpoint answers 200.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import kmock
import pytest
import yaml
from conftest import ROOT
from kube_fake import KubeFake, declare_resources

CHART = ROOT / "charts" / "kvloop"
VALUES = [None, *sorted((CHART / "examples").glob("*.yaml"))]
KUSTOMIZE = [ROOT / "manifests" / "base",
             *sorted(p for p in (ROOT / "manifests" / "overlays").iterdir() if p.is_dir())]
SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
VENV_BIN = Path(sys.executable).parent
LIVENESS = re.compile(r"^(--liveness=)?(https?://)([^/:]+):(\d+)(/.*)?$")
PEERINGS = {"ClusterKopfPeering": "kopf.dev/v1/clusterkopfpeerings",
            "KopfPeering": "kopf.dev/v1/kopfpeerings"}


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _render(cmd: list) -> list[dict]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
    return _docs(proc.stdout)


def rendered_variants(tools: dict[str, Path]) -> dict[str, list[dict]]:
    """Every install variant's objects, by a readable name."""
    out: dict[str, list[dict]] = {}
    for helm in ("helm3", "helm4"):
        for values in VALUES:
            cmd = [tools[helm], "template", "kvloop", CHART, "--namespace", "kvloop-system"]
            out[f"{helm}:{values.name if values else 'default'}"] = _render(cmd + (["-f",
                                                                                    values] if values
                                                                                    else []))
    for path in KUSTOMIZE:
        out[f"kustomize:{path.relative_to(ROOT / 'manifests')}"] = _render([tools["kubectl"], "kustomize",
                                                                            path])
    for path in SAMPLES:
        out[f"sample:{path.name}"] = _docs(path.read_text())
    return out


def operator_containers(objs: list[dict]) -> list[dict]:
    found = []
    for obj in objs:
        if obj.get("kind") != "Deployment":
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            if (c.get("command") or [])[:2] == ["kvloop", "operator"]:
                found.append(c)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localize(argv: list[str], port: int) -> tuple[list[str], str]:
    """argv with the liveness host:port replaced by 127.0.0.1:port (and the URL to poll)."""
    out, url = [], ""
    for i, arg in enumerate(argv):
        prev = argv[i - 1] if i else ""
        m = LIVENESS.match(arg)
        if m and (m.group(1) or prev == "--liveness"):
            url = f"{m.group(2)}127.0.0.1:{port}{m.group(5) or ''}"
            arg = (m.group(1) or "") + url
        out.append(arg)
    return out, url


def write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "users": [{"name": "fake", "user": {}}]}))


async def run_until_ready(argv: list[str], env: dict[str, str], url: str, timeout: float = 30.0,
                          also: Callable[[], bool] = lambda: True) -> str:
    """Start argv, wait for 200 from the liveness URL (and for `also`), stop it; returns its log on
    failure, '' on success."""
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    problem = (f"liveness {url} did not answer 200 (or the peering object was not kept alive) "
               f"within {timeout:.0f}s")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while loop.time() < deadline and proc.returncode is None:
            try:
                async with http.get(url) as rsp:
                    if rsp.status == 200 and also():
                        problem = ""
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    if proc.returncode is not None:
        problem = f"exited with code {proc.returncode} before it was ready"
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 15)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        problem = problem or "did not stop within 15s of SIGTERM"
    return f"{problem}\n{out.decode(errors='replace')[-3000:]}" if problem else ""


def test_help_lists_the_options():
    for argv in ([str(VENV_BIN / "kvloop"), "operator", "--help"],
                 [sys.executable, "-m", "kvloop.operator.main", "--help"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
        for opt in ("--namespace", "--peering", "--liveness", "--image", "--status-interval", "--kubeconfig",
                    "--verbose"):
            assert opt in out, (argv, opt)


def test_options_before_anything_else_parse():
    from kvloop.engine.cli import build_parser

    args = build_parser().parse_args(["operator", "--liveness=http://0.0.0.0:8080/healthz", "--peering=p",
                                      "--namespace=a", "-n", "b-*", "--verbose"])
    assert (args.liveness, args.peering, args.namespace, args.verbose) == ("http://0.0.0.0:8080/healthz", "p",
                                                                         ["a", "b-*"], True)


@pytest.mark.asyncio(loop_scope="session")
async def test_every_rendered_operator_command_line_starts(k8s_tools, tmp_path):
    variants = rendered_variants(k8s_tools)
    runs: dict[str, tuple[list[str], dict[str, str], list[dict]]] = {}
    for name, objs in variants.items():
        containers = operator_containers(objs)
        assert containers or name.startswith("sample:"), f"{name}: no `kvloop operator` container"
        peerings = [o for o in objs if o["kind"] in PEERINGS]
        for c in containers:
            env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
            key = json.dumps([c["command"], c.get("args") or [], env, peerings], sort_keys=True)
            runs.setdefault(key, (c["command"] + (c.get("args") or []), env, peerings))
    assert any("--peering" in " ".join(a) for a, _, _ in runs.values()), "no variant runs with peering"
    for argv, _, peerings in runs.values():  # a replica set with peering is useless without its object
        names = [a.split("=", 1)[1] for a in argv if a.startswith("--peering=")]
        assert all(any(p["metadata"]["name"] == n for p in peerings) for n in names), (argv,
                                                                                       "no peering object")

    failures = []
    async with KubeFake() as fake, kmock.Server(fake, host="127.0.0.1"):
        declare_resources(fake)
        for plural, kind in PEERINGS.items():
            fake.resources[kind] = kmock.ResourceInfo(kind=plural, singular=plural.lower(),
                                                      namespaced=plural == "KopfPeering",
                                                      verbs={"get", "list", "watch", "create", "patch"})
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, str(fake.url).rstrip("/"))
        for argv, env, peerings in runs.values():
            for p in peerings:  # the variant's own peering objects, as the install would create them
                ns = p["metadata"].get("namespace")
                scope = f"/namespaces/{ns}" if ns else ""
                path = f"/apis/kopf.dev/v1{scope}/{PEERINGS[p['kind']].rsplit('/', 1)[1]}"
                rsp = await fake.post(path, json=p)
                assert rsp.status in (200, 201, 409), await rsp.text()
            argv, url = localize(argv, free_port())
            assert url, f"{argv}: no --liveness to wait on"
            full_env = {**os.environ, **env, "KUBECONFIG": str(kubeconfig),
                        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
            full_env.pop("KUBERNETES_SERVICE_HOST", None)
            mark = len(fake._requests)

            def peers_announced(peerings: list[dict] = peerings, mark: int = mark) -> bool:
                # Each replica patches its keep-alive into the peering object: it uses that very object.
                return all(any(r.method == "PATCH"
                               and r.url.path.endswith(f"peerings/{p['metadata']['name']}")
                               for r in fake._requests[mark:]) for p in peerings)

            problem = await run_until_ready(argv, full_env, url, also=peers_announced)
            if problem:
                failures.append(f"{' '.join(argv)}: {problem}")
    assert not failures, "\n\n".join(failures)
    assert len(runs) >= 4
