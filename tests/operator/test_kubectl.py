"""The real kubectl (the binary scripts/install_k8s_tools.sh installs) against the fake API server
with the real operator running: apply the CRD and a sample, get with the CRD's printer columns,
scale, patch, wait and delete, as a cluster user would.

kmock serves no OpenAPI documents, so `apply` runs with `--validate=false` (client-side schema
validation needs /openapi/v3), and it sends no initial-events bookmark, so kubectl's WatchList client
feature is off (KUBECTL_ENV); everything else uses kubectl's defaults. The fake's pods never run,
so kubectl itself plays the Deployment controller: it patches the Deployment's status subresource.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
from pathlib import Path

import kmock
import pytest
import yaml
from conftest import ROOT, OperatorRunner
from kube_fake import KubeFake, declare_resources

from kvloop.operator import constants as C
from kvloop.operator import remote_store as RS
from kvloop.operator.render import render_children

pytestmark = pytest.mark.asyncio(loop_scope="session")

CRD = ROOT / "manifests" / "base" / "crd.yaml"
SAMPLE = ROOT / "manifests" / "samples" / "cpu-embedded.yaml"
NAME = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
NS = "default"
# kubectl 1.35 watches with WatchList (sendInitialEvents) and waits for a bookmark marking the end of
# the initial events, which kmock does not send; with the feature off it lists, then watches.
KUBECTL_ENV = {"KUBE_FEATURE_WatchListClient": "false"}


class Kubectl:
    def __init__(self, binary: Path, server: str, home: Path):
        self.binary, self.home = binary, home
        self.config = home / "kubeconfig"
        self.config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server}}],
            "users": [{"name": "user", "user": {"token": "unused"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "user", "namespace": NS}}]}))

    async def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(self.binary), "--kubeconfig", str(self.config), "--cache-dir", str(self.home / "cache"),
            "--request-timeout", "20s", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **KUBECTL_ENV})
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: "
                                 f"{err.decode()}{out.decode()}")
        return out.decode() + (err.decode() if not check else "")


def printer_columns() -> list[dict]:
    return yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]


def custom_columns() -> str:
    """The CRD's printer columns (header without spaces, so the output splits on whitespace)."""
    cols = [f"{c['name'].upper().replace(' ', '_')}:{c['jsonPath']}" for c in printer_columns()]
    return "NAME:.metadata.name," + ",".join(cols)


@pytest.fixture()
async def cluster(k8s_tools, tmp_path):
    async with KubeFake() as fake, kmock.Server(fake, host="127.0.0.1"):
        declare_resources(fake, inference_services=False)  # kubectl applies the CRD, which declares it
        yield fake, Kubectl(k8s_tools["kubectl"], str(fake.url).rstrip("/"), tmp_path)


async def kubectl_apply_text(kubectl: Kubectl, tmp_path: Path, obj: dict) -> str:
    path = tmp_path / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return await kubectl("apply", "--validate=false", "-f", str(path), check=False)


async def test_kubectl_drives_an_inference_service_end_to_end(cluster, tmp_path):
    fake, kubectl = cluster
    # The CRD: created, then served under its short name.
    await kubectl("apply", "--validate=false", "-f", str(CRD))
    crd = json.loads(await kubectl("get", "crd", "inferenceservices.kvloop.io", "-o", "json"))
    assert crd["spec"]["names"]["shortNames"] == ["kvis"]
    resources = await kubectl("api-resources", "--api-group=kvloop.io", "-o", "name")
    assert resources.split() == ["inferenceservices.kvloop.io"]
    assert "No resources found" in await kubectl("get", "kvis", check=False)
    assert "pods" in (await kubectl("api-resources", "--api-group=", "-o", "name")).split()  # core group

    # Refused at apply time with the CRD's message (the fake admits objects by the applied CRD).
    bad = yaml.safe_load(SAMPLE.read_text())
    bad["metadata"]["name"] = "too-big"
    bad["spec"]["resources"] = {"requests": {"cpu": "-2"}, "limits": {"memory": "1Gi"}}
    refused = await kubectl_apply_text(kubectl, tmp_path, bad)
    assert "resources.requests.cpu must not be negative" in refused
    assert "must fit the memory limit resources.limits.memory" in refused and "is invalid" in refused
    assert "No resources found" in await kubectl("get", "kvis", check=False)

    operator = OperatorRunner(fake)
    await operator.start()
    try:
        await kubectl("apply", "--validate=false", "-f", str(SAMPLE))
        await kubectl("wait", "--for=create", f"deployment/{NAME}", "--timeout=30s")
        assert NAME in await kubectl("get", "kvis")
        # Play the Deployment controller: every replica is up.
        gen = await kubectl("get", "deployment", NAME, "-o", "jsonpath={.metadata.generation}")
        await kubectl("patch", "deployment", NAME, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"observedGeneration": int(gen), "replicas": 1, "updatedReplicas": 1,
                        "readyReplicas": 1,
                        "availableReplicas": 1}}))
        await kubectl("wait", "--for=condition=Ready", f"kvis/{NAME}", "--timeout=30s")

        header, row = (await kubectl("get", "kvis", NAME, "-o",
                                     f"custom-columns={custom_columns()}")).splitlines()
        values = dict(zip(header.split(), row.split(), strict=True))
        assert values["NAME"] == NAME and values["READY"] == "True" and values["REPLICAS"] == "1"
        assert values["URL"] == f"http://{NAME}.{NS}.svc.cluster.local:8000/v1"
        assert values["AGE"].endswith("Z")  # the creation timestamp

        await kubectl("scale", f"kvis/{NAME}", "--replicas=2")
        await kubectl("wait", "--for=jsonpath={.spec.replicas}=2", f"deployment/{NAME}", "--timeout=30s")
        assert (await kubectl("get", f"kvis/{NAME}", "-o", "jsonpath={.spec.replicas}")) == "2"
        await kubectl("wait", "--for=create", f"poddisruptionbudget/{NAME}", "--timeout=30s")

        await kubectl("patch", f"kvis/{NAME}", "--type=merge", "-p",
                      '{"spec": {"feedback": {"mode": "observe"}}}')
        gen = await kubectl("get", f"kvis/{NAME}", "-o", "jsonpath={.metadata.generation}")
        await kubectl("wait", f"--for=jsonpath={{.status.observedGeneration}}={gen}", f"kvis/{NAME}",
                      "--timeout=30s")
        sidecar = await kubectl("get", "configmap", f"{NAME}-config", "-o", r"jsonpath={.data.sidecar\.yaml}")
        assert "mode: observe" in sidecar

        await kubectl("delete", f"kvis/{NAME}", "--wait=false")
        await kubectl("wait", "--for=delete", f"kvis/{NAME}", "--timeout=30s")  # the finalizer ran
        assert "No resources found" in await kubectl("get", "kvis", check=False)
        await kubectl("wait", "--for=delete", f"deployment/{NAME}", "--timeout=30s")
    finally:
        await operator.stop()


# ---- issue 55: three replicas sharing a managed remote KV store, routed by an InferencePool -----------
FLEET_VALUES = ROOT / "charts" / "kvloop" / "examples" / "fleet-values.yaml"
POOLS = "inference.networking.k8s.io/v1/inferencepools"


def fleet_from_chart(helm: Path) -> dict:
    """The InferenceService the chart renders from examples/fleet-values.yaml (what helm install applies)."""
    out = subprocess.run([str(helm), "template", "kvloop", str(ROOT / "charts" / "kvloop"), "--namespace", NS,
                          "-f", str(FLEET_VALUES), "-s", "templates/inferenceservices.yaml"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (fleet,) = [d for d in yaml.safe_load_all(out) if d]
    return fleet


def operator_children(fake: KubeFake, name: str) -> set[tuple[str, str]]:
    """(kind, name) of every live object carrying the operator's ownership labels for `name`."""
    out = set()
    for stored in fake.objects.values():
        meta = (stored.raw or {}).get("metadata") or {}
        labels = meta.get("labels") or {}
        if not stored.deleted and labels.get("app.kubernetes.io/managed-by") == "kvloop-operator" \
                and labels.get("app.kubernetes.io/instance") == name:
            out.add((stored.raw["kind"], meta["name"]))
    return out


async def test_kubectl_drives_a_fleet_with_a_managed_store_and_an_inference_pool(cluster, tmp_path,
                                                                                 k8s_tools):
    fake, kubectl = cluster
    fake.resources[POOLS] = kmock.ResourceInfo(kind="InferencePool", singular="inferencepool",
                                               namespaced=True,
                                               verbs={"get", "list", "watch", "create", "patch", "delete"})
    await kubectl("apply", "--validate=false", "-f", str(CRD))
    fleet = fleet_from_chart(k8s_tools["helm4"])
    name = fleet["metadata"]["name"]
    assert fleet["spec"]["replicas"] == 3 and fleet["spec"]["routing"]["mode"] == "InferencePool"

    # Bad combinations are refused at apply time with the CRD's messages.
    for remote, message in [({"url": "redis://cache:6379/0", "managed": True, "storage": {"size": "1Gi"}},
                             RS.ONE_OF),
                            ({"managed": True}, RS.NEEDS_STORAGE),
                            ({"url": "memcached://cache:11211"}, RS.SCHEME)]:
        bad = copy.deepcopy(fleet)
        bad["metadata"]["name"] = "bad-fleet"
        bad["spec"]["engine"]["kvCache"]["remote"] = remote
        refused = await kubectl_apply_text(kubectl, tmp_path, bad)
        assert message in refused and "is invalid" in refused, refused

    operator = OperatorRunner(fake)
    await operator.start()
    try:
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(fleet))
        await kubectl("apply", "--validate=false", "-f", str(path))
        for child in (f"statefulset/{name}-kv", f"inferencepool/{name}", f"deployment/{name}-epp",
                      f"deployment/{name}", f"poddisruptionbudget/{name}-kv", f"secret/{name}-kv-password"):
            await kubectl("wait", "--for=create", child, "--timeout=30s")
        gen = await kubectl("get", f"kvis/{name}", "-o", "jsonpath={.metadata.generation}")
        await kubectl("wait", f"--for=jsonpath={{.status.observedGeneration}}={gen}", f"kvis/{name}",
                      "--timeout=30s")
        # What the operator made is exactly what it renders for the chart's InferenceService.
        rendered = {(c["kind"], c["metadata"]["name"])
                    for c in render_children(name, NS, "uid", fleet["spec"])}
        assert operator_children(fake, name) == rendered
        assert (await kubectl("get", "deployment", name, "-o", "jsonpath={.spec.replicas}")) == "3"
        engine_yaml = yaml.safe_load(await kubectl("get", "configmap", f"{name}-config", "-o",
                                                   r"jsonpath={.data.engine\.yaml}"))
        assert engine_yaml["kv_cache"]["remote_url"] == f"redis://{name}-kv:6379/0"
        env = json.loads(await kubectl("get", "deployment", name, "-o",
                                       "jsonpath={.spec.template.spec.containers[0].env}"))
        assert {"name": C.KV_REMOTE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": {
            "name": f"{name}-kv-password", "key": "password"}}} in env
        pool = json.loads(await kubectl("get", f"inferencepool/{name}", "-o", "json"))
        assert pool["spec"]["endpointPickerRef"]["name"] == f"{name}-epp"
        password = await kubectl("get", "secret", f"{name}-kv-password", "-o",
                                 "jsonpath={.stringData.password}")
        assert len(password) >= 32

        # A spec change reconciles everything again; the generated password stays the one the store has.
        await kubectl("patch", f"kvis/{name}", "--type=merge", "-p",
                      '{"spec": {"feedback": {"mode": "observe"}}}')
        gen = await kubectl("get", f"kvis/{name}", "-o", "jsonpath={.metadata.generation}")
        await kubectl("wait", f"--for=jsonpath={{.status.observedGeneration}}={gen}", f"kvis/{name}",
                      "--timeout=30s")
        assert await kubectl("get", "secret", f"{name}-kv-password", "-o",
                             "jsonpath={.stringData.password}") == password

        # A bad combination stored under a CRD without these rules (an object older than them; the fake
        # admits nothing then, as it does not ratchet unchanged fields): Degraded with the same message,
        # and the children of the last good spec stay.
        crds, fake.crds = fake.crds, {}
        try:
            await kubectl("patch", f"kvis/{name}", "--type=merge", "-p", json.dumps(
                {"spec": {"engine": {"kvCache": {"remote": {"url": "redis://elsewhere:6379/0"}}}}}))
            await kubectl("wait", "--for=condition=Degraded", f"kvis/{name}", "--timeout=30s")
            message = await kubectl("get", f"kvis/{name}", "-o",
                                    'jsonpath={.status.conditions[?(@.type=="Degraded")].message}')
            assert RS.ONE_OF in message
            assert (await kubectl("get", f"statefulset/{name}-kv", "-o", "name")).strip()
        finally:
            fake.crds = crds

        await kubectl("delete", f"kvis/{name}", "--wait=false")
        await kubectl("wait", "--for=delete", f"kvis/{name}", "--timeout=30s")
        for child in (f"statefulset/{name}-kv", f"inferencepool/{name}", f"deployment/{name}-epp"):
            await kubectl("wait", "--for=delete", child, "--timeout=30s")
    finally:
        await operator.stop()
