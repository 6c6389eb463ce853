"""Stored objects that no schema would admit (the fake API server validates nothing, like an object
written before the CRD had a schema): the operator reports Degraded with a message, keeps serving
the others, and a delete still completes (the finalizer is removed)."""

from __future__ import annotations

import kmock
import pytest
from conftest import eventually
from test_e2e import BASE, CR, NAME, NS, cond, create, obj, raw, status_of

from kvloop.operator import constants as C

pytestmark = pytest.mark.asyncio(loop_scope="session")


def body(spec, **extra) -> dict:
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": spec, **extra}


# (stored object, what the Degraded message must name; None: the spec is fine, only the status is not)
MALFORMED = {
    "spec-is-a-string": (body("replicas: 2"), "spec must be an object, not string"),
    "spec-is-a-list": (body([{"replicas": 2}]), "spec must be an object, not array"),
    "spec-is-null": (body(None), "spec must be an object, not null"),
    "replicas-is-a-string": (body({"replicas": "two"}), "spec.replicas must be an integer, not string"),
    "engine-is-a-list": (body({"engine": ["cpu"]}), "spec.engine must be an object, not array"),
    "nested-wrong-types": (body({"engine": {"kvCache": {"disk": "yes"}}, "feedback": {"batchCap": 8}}),
                           "spec.engine.kvCache.disk must be an object, not string; "
                           "spec.feedback.batchCap must be an object, not integer"),
    "port-is-an-object": (body({"service": {"port": {"number": 80}}}),
                          "spec.service.port must be an integer"),
    "monitor-flag-is-a-string": (body({"observability": {"serviceMonitor": "on"}}),
                                 "spec.observability.serviceMonitor must be an object"),
    "slo-is-a-string": (body({"slo": "fast"}), "spec.slo must be an object, not string"),
    # the engine would refuse to start with it
    "slo-ttft-of-zero": (body({"slo": {"ttftSeconds": 0}}), "slo.ttftSeconds must be between 0.001 and 3600"),
    # (A status that is no object at all is replaced whole by the operator; kmock 0.8's merge patch
    # refuses to replace a scalar with an object, unlike RFC 7386 and the API server, so not here.)
    "status-parts-malformed": (body({"replicas": 1}, status={"conditions": ["Ready", {"status": "True"}],
                                                             "feedback": {"lastDecision": "x"}}), None),
}


@pytest.mark.parametrize("stored,message", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_object_is_degraded_and_deletable(kube, operator, stored, message):
    await create(kube, stored)
    st = await eventually(lambda: isinstance(status_of(kube),
                                             dict) and status_of(kube).get("observedGeneration") == 1
                          and status_of(kube), timeout=20)
    degraded = cond(st, "Degraded")
    if message is None:  # the stored status was replaced by a well-formed one; the spec was realised
        assert degraded["status"] == "False", degraded
        assert obj(kube, "apps/v1/deployments") is not None
    else:
        assert (degraded["status"], degraded["reason"]) == ("True", "SpecNotRealisable"), degraded
        assert message in degraded["message"], degraded["message"]
        assert obj(kube, "apps/v1/deployments") is None
    assert operator.task is not None and not operator.task.done()
    rsp = await kube.delete(f"{BASE}/{NAME}")
    assert rsp.status == 200
    # the delete handler ran and removed the finalizer
    await eventually(lambda: obj(kube, CR) is None, timeout=20)
    assert obj(kube, "v1/services") is None and obj(kube, "apps/v1/deployments") is None


async def test_repaired_spec_recovers(kube, operator):
    await create(kube, body({"replicas": "two"}))
    await eventually(lambda: cond(status_of(kube), "Degraded")["status"] == "True")
    rsp = await kube.patch(f"{BASE}/{NAME}", json={"spec": {"replicas": 2}},
                           headers={"Content-Type": "application/merge-patch+json"})
    assert rsp.status == 200
    await eventually(lambda: raw(kube, "apps/v1/deployments")["spec"]["replicas"] == 2)
    await eventually(lambda: cond(status_of(kube), "Degraded")["status"] == "False")


async def test_object_without_uid_or_generation(kube, operator):
    """Stored around the API server (which always sets them): no children that name no owner."""
    kube.objects[kmock.resource(CR), NS, NAME] = body({"replicas": 1})
    st = await eventually(lambda: status_of(kube).get("conditions") and status_of(kube), timeout=20)
    degraded = cond(st, "Degraded")
    assert degraded["status"] == "True" and "metadata.uid is not set" in degraded["message"], degraded
    assert obj(kube, "apps/v1/deployments") is None
    assert (await kube.delete(f"{BASE}/{NAME}")).status == 200
    await eventually(lambda: obj(kube, CR) is None, timeout=20)
