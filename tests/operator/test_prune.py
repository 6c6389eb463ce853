"""Pruning, end to end: children an InferenceService no longer renders are deleted, and only those."""

from __future__ import annotations

import kmock
import pytest
from conftest import eventually
from test_e2e import BASE, CR, NAME, NS, cr_body, create, obj, patch, raw, status_of

from kvloop.operator import constants as C
from kvloop.operator.kube import PLURALS
from kvloop.operator.render import OWNED_KINDS, render_children

pytestmark = pytest.mark.asyncio(loop_scope="session")

POOLS = "inference.networking.k8s.io/v1/inferencepools"
MONITORS = "monitoring.coreos.com/v1/servicemonitors"
PDBS = "policy/v1/poddisruptionbudgets"
EVERYTHING = dict(replicas=2, observability={"serviceMonitor": {"enabled": True}},
                  routing={"mode": "InferencePool"})


@pytest.fixture(autouse=True)
def serve_inference_pools(kube):
    """The Gateway API Inference Extension's InferencePool, as a cluster that installed it serves it."""
    kube.resources[POOLS] = kmock.ResourceInfo(kind="InferencePool", singular="inferencepool",
                                               namespaced=True,
                                               verbs={"get", "list", "watch", "create", "patch", "delete"})


async def generation_done(kube, generation: int) -> None:
    await eventually(lambda: status_of(kube).get("observedGeneration") == generation)


@pytest.mark.parametrize("change,resource", [
    ({"replicas": 1}, PDBS),
    ({"observability": {"serviceMonitor": {"enabled": False}}}, MONITORS),
    ({"routing": {"mode": "none"}}, POOLS),
], ids=["pdb-after-scale-to-1", "servicemonitor-disabled", "inferencepool-disabled"])
async def test_child_no_longer_rendered_is_pruned(kube, operator, change, resource):
    await create(kube, cr_body(**EVERYTHING))
    for res in (PDBS, MONITORS, POOLS):
        await eventually(lambda res=res: raw(kube, res))
    await generation_done(kube, 1)
    await patch(kube, f"{BASE}/{NAME}", {"spec": change})
    await generation_done(kube, 2)
    await eventually(lambda: obj(kube, resource) is None)
    for res in {PDBS, MONITORS, POOLS} - {resource}:  # the others stay
        assert obj(kube, res) is not None, res
    for res in ("apps/v1/deployments", "v1/services"):
        assert obj(kube, res) is not None, res
    def pruned_event() -> bool:  # kopf posts events from a queue, a moment after the handler
        events = [e.raw for k, e in kube.objects.items() if k[0] == kmock.resource("v1/events")]
        return any("pruned " in e.get("message", "") for e in events)

    await eventually(pruned_event)


async def test_scale_subresource_to_one_prunes_the_pdb(kube, operator):
    await create(kube, cr_body(replicas=3))
    await eventually(lambda: raw(kube, PDBS))
    await patch(kube, f"{BASE}/{NAME}/scale", {"spec": {"replicas": 1}})
    await eventually(lambda: obj(kube, PDBS) is None)
    await eventually(lambda: raw(kube, "apps/v1/deployments")["spec"]["replicas"] == 1)


async def test_only_this_services_children_are_pruned(kube, operator):
    """Same labels without our owner reference, or another InferenceService's child: left alone."""
    labels = C.common_labels(NAME)
    foreign = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "hand-made", "namespace": NS, "labels": labels},
               "spec": {"maxUnavailable": 1, "selector": {"matchLabels": C.selector_labels(NAME)}}}
    assert (await kube.post(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
                            json=foreign)).status in (200, 201)
    other = render_children("other", NS, "uid-other", {"replicas": 2})
    for child in other:
        if child["kind"] == "PodDisruptionBudget":
            await kube.post(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", json=child)
    await create(kube, cr_body(**EVERYTHING))
    await generation_done(kube, 1)
    await patch(kube, f"{BASE}/{NAME}", {"spec": {"replicas": 1}})
    await generation_done(kube, 2)
    await eventually(lambda: obj(kube, PDBS) is None)
    assert obj(kube, PDBS, "hand-made") is not None and obj(kube, PDBS, "other") is not None
    await kube.delete(f"{BASE}/{NAME}")
    await eventually(lambda: obj(kube, CR) is None, timeout=20)
    assert obj(kube, PDBS, "hand-made") is not None and obj(kube, PDBS, "other") is not None


async def test_delete_removes_children_of_older_specs_too(kube, operator):
    await create(kube, cr_body(**EVERYTHING))
    await eventually(lambda: raw(kube, POOLS))
    await generation_done(kube, 1)
    uid = raw(kube, CR)["metadata"]["uid"]
    # A child an older operator version or an earlier spec left behind under another name.
    stale = render_children(NAME, NS, uid, {"replicas": 1})[3]  # the ConfigMap
    stale["metadata"]["name"] = f"{NAME}-config-old"
    assert (await kube.post(f"/api/v1/namespaces/{NS}/configmaps", json=stale)).status in (200, 201)
    await kube.delete(f"{BASE}/{NAME}")
    await eventually(lambda: obj(kube, CR) is None, timeout=20)  # the finalizer was removed
    for api_version, kind in OWNED_KINDS:
        res = kmock.resource(f"{api_version}/{PLURALS[kind]}")
        left = [k for k, o in kube.objects.items() if k[0] == res and not o.deleted]
        assert left == [], (kind, left)


async def test_kinds_the_operator_may_not_list_are_skipped(kube, operator):
    """minimal-rbac-values.yaml grants nothing on ServiceMonitors: listing them answers 403, and the
    operator cannot have created any, so pruning passes over them instead of failing the reconcile."""
    kube["get", kmock.resource(MONITORS)] << 403
    await create(kube, cr_body(replicas=2))
    await generation_done(kube, 1)
    await patch(kube, f"{BASE}/{NAME}", {"spec": {"replicas": 1}})
    await generation_done(kube, 2)
    await eventually(lambda: obj(kube, PDBS) is None)
    assert any(r.method == "GET" and r.url.path.endswith("/servicemonitors") for r in kube._requests)
    degraded = next(c for c in status_of(kube)["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded
