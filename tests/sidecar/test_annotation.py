"""The kvloop.io/feedback pod annotation, patched through the Kubernetes API (kmock's emulator),
only on change plus a slow heartbeat; the operator's own parser reads it back."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest

kmock = pytest.importorskip("kmock")

from kvloop.sidecar.annotation import AnnotationPublisher, KubeAccess  # noqa: E402

NS, POD = "llm", "chat-7d9f-abcde"
KEY = "kvloop.io/feedback"


@pytest.fixture()
async def kube():
    fake = kmock.KubernetesEmulator()
    async with fake, kmock.Server(fake, host="127.0.0.1"):
        fake.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", singular="pod", namespaced=True,
                                                       verbs={"get", "list", "patch", "update"})
        fake.objects["v1/pods", NS, POD] = {"apiVersion": "v1", "kind": "Pod",
                                            "metadata": {"name": POD, "namespace": NS,
                                                         "labels": {"app": "x"}},
                                            "status": {"phase": "Running"}}
        yield fake


def annotations(kube) -> dict:
    return kube.objects["v1/pods", NS, POD].raw["metadata"].get("annotations") or {}


VALUE = {"batchCap": 24, "watermark": 0.4, "mode": "enforce", "converged": False,
         "lastDecision": {"knob": "batch_cap", "reason": "queued_kv_headroom",
                          "at": "2026-01-01T00:00:00.00Z"}}


@pytest.mark.asyncio(loop_scope="session")
async def test_publish_on_change_and_heartbeat(kube, monkeypatch):
    now = [1_800_000_000.0]
    monkeypatch.setenv("KVLOOP_KUBE_SERVER", str(kube.url))
    monkeypatch.setenv("KVLOOP_KUBE_TOKEN", "sa-token")
    monkeypatch.setenv("POD_NAME", POD)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    pub = AnnotationPublisher.from_env(KEY, heartbeat_s=60)
    pub.clock = lambda: now[0]
    publish = lambda v: asyncio.to_thread(pub.maybe_publish, v)  # noqa: E731 (the client is blocking)

    assert await publish(VALUE)
    raw = annotations(kube)[KEY]
    data = json.loads(raw)
    assert data["batchCap"] == 24 and data["lastDecision"]["reason"] == "queued_kv_headroom"
    assert data["updatedAt"] == "2027-01-15T08:00:00.000Z"
    # a merge, not a replace
    assert kube.objects["v1/pods", NS, POD].raw["metadata"]["labels"] == {"app": "x"}

    now[0] += 10
    assert not await publish(dict(VALUE))  # unchanged, heartbeat not due: no call
    now[0] += 60
    assert await publish(dict(VALUE))  # heartbeat
    assert json.loads(annotations(kube)[KEY])["updatedAt"] == "2027-01-15T08:01:10.000Z"
    now[0] += 1
    assert await publish({**VALUE, "batchCap": 32})  # change
    assert json.loads(annotations(kube)[KEY])["batchCap"] == 32
    assert pub.patches == 3 and pub.errors == 0
    assert any(r.headers.get("Authorization") == "Bearer sa-token" for r in kube)

    # the operator reads what the sidecar wrote
    status = pytest.importorskip("kvloop.operator.status")
    pod = kube.objects["v1/pods", NS, POD].raw
    entry = status._pod_feedback(pod, dt.datetime.fromtimestamp(now[0], dt.UTC), 120.0)
    assert entry["state"] == "Fresh" and entry["batchCap"] == 32
    assert entry["lastDecision"]["knob"] == "batch_cap"
    pub.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_api_errors_are_counted_and_retried(kube):
    pub = AnnotationPublisher(KubeAccess(str(kube.url).rstrip("/")), NS, "no-such-pod", KEY)
    assert not await asyncio.to_thread(pub.maybe_publish, VALUE)
    assert pub.errors == 1 and pub.published is None  # retried on the next tick
    pub.close()


def test_not_in_a_cluster(monkeypatch):
    for var in ("POD_NAME", "POD_NAMESPACE", "KVLOOP_KUBE_SERVER", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    assert AnnotationPublisher.from_env(KEY, 60) is None
    monkeypatch.setenv("POD_NAME", POD)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    assert AnnotationPublisher.from_env(KEY, 60) is None  # no API server to talk to
