"""End-to-end: the real kopf operator reconciling InferenceServices in kmock."""

from __future__ import annotations

import copy
import datetime as dt
import json

import kmock
import pytest
import yaml
from conftest import OperatorRunner, eventually

from kvloop.operator import constants as C

pytestmark = pytest.mark.asyncio(loop_scope="session")

CR = "kvloop.io/v1alpha1/inferenceservices"
NS = "team-a"
NAME = "chat"
BASE = f"/apis/kvloop.io/v1alpha1/namespaces/{NS}/inferenceservices"


def cr_body(**spec) -> dict:
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"replicas": 1, **spec}}


def obj(kube, res: str, name: str = NAME, ns: str = NS):
    try:
        found = kube.objects[res, ns, name]
    except KeyError:
        return None
    return None if found.deleted else found


def raw(kube, res: str, name: str = NAME) -> dict:
    o = obj(kube, res, name)
    assert o is not None, f"{res} {name} missing"
    return o.raw


def cond(status: dict, ctype: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ctype)


async def create(kube, body: dict) -> None:
    rsp = await kube.post(BASE, json=body)
    assert rsp.status == 200 or rsp.status == 201, await rsp.text()


async def test_create_renders_children_with_owner_references(kube, operator):
    await create(kube, cr_body(observability={"serviceMonitor": {"enabled": True}}))
    deploy = await eventually(lambda: raw(kube, "apps/v1/deployments"))
    uid = raw(kube, CR)["metadata"]["uid"]
    for res, name in [("apps/v1/deployments", NAME), ("v1/services", NAME),
                      ("v1/configmaps", f"{NAME}-config"),
                      ("v1/serviceaccounts", NAME), ("rbac.authorization.k8s.io/v1/roles", NAME),
                      ("rbac.authorization.k8s.io/v1/rolebindings", NAME),
                      ("monitoring.coreos.com/v1/servicemonitors", NAME)]:
        child = await eventually(lambda res=res, name=name: raw(kube, res, name))
        ref = child["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (C.KIND, NAME, uid, True)
    pod = deploy["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["engine", "sidecar"]
    assert pod["containers"][0]["command"][:2] == ["kvloop", "serve"]
    control = next(v for v in pod["volumes"] if v["name"] == "control")
    assert control["emptyDir"]["medium"] == "Memory"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert obj(kube, "policy/v1/poddisruptionbudgets") is None  # one replica: no PDB
    status = await eventually(lambda: raw(kube, CR).get("status",
                                                        {}).get("observedGeneration") == 1 and raw(kube,
                                                                                                   CR)["status"])
    assert cond(status, "Progressing")["status"] == "True"
    assert cond(status, "Ready")["status"] == "False"
    assert status["url"] == f"http://{NAME}.{NS}.svc.cluster.local:8000/v1"
    assert status["selector"] == "app.kubernetes.io/name=kvloop,app.kubernetes.io/instance=chat"
    assert raw(kube, CR)["spec"] == {"replicas": 1, "observability": {"serviceMonitor": {"enabled": True}}}


def status_of(kube) -> dict:
    return raw(kube, CR).get("status") or {}


def posts(kube, fragment: str) -> int:
    return sum(1 for r in kube._requests if r.method == "POST" and fragment in r.url.path)


async def patch(kube, path: str, body: dict) -> None:
    rsp = await kube.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
    assert rsp.status == 200, await rsp.text()


async def ready_children(kube) -> None:
    await eventually(lambda: status_of(kube).get("observedGeneration") == 1)


async def test_spec_change_patches_children_and_advances_observed_generation(kube, operator):
    await create(kube, cr_body())
    await ready_children(kube)
    old_cm = copy.deepcopy(raw(kube, "v1/configmaps", f"{NAME}-config"))
    old_hash = raw(kube,
                   "apps/v1/deployments")["spec"]["template"]["metadata"]["annotations"]["kvloop.io/engine-config-hash"]
    await patch(kube, f"{BASE}/{NAME}",
                {"spec": {"replicas": 2, "engine": {"scheduler": {"mode": "continuous+lru"}},
                                                  "feedback": {"intervalSeconds": 10}}})
    assert raw(kube, CR)["metadata"]["generation"] == 2
    await eventually(lambda: status_of(kube).get("observedGeneration") == 2)
    cm = raw(kube, "v1/configmaps", f"{NAME}-config")
    assert cm["data"] != old_cm["data"] and "continuous+lru" in cm["data"]["engine.yaml"]
    assert "period_s: 10" in cm["data"]["sidecar.yaml"]
    deploy = raw(kube, "apps/v1/deployments")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["template"]["metadata"]["annotations"]["kvloop.io/engine-config-hash"] != old_hash
    pdb = await eventually(lambda: raw(kube, "policy/v1/poddisruptionbudgets"))
    assert pdb["spec"]["maxUnavailable"] == 1
    assert posts(kube, "/deployments") == 1  # patched in place, never re-created
    # A feedback-only change reloads the sidecar's file; the engine's pods are not restarted.
    await patch(kube, f"{BASE}/{NAME}", {"spec": {"feedback": {"mode": "observe"}}})
    await eventually(lambda: status_of(kube).get("observedGeneration") == 3)
    assert "mode: observe" in raw(kube, "v1/configmaps", f"{NAME}-config")["data"]["sidecar.yaml"]
    assert (raw(kube, "apps/v1/deployments")["spec"]["template"]["metadata"]["annotations"]
            == deploy["spec"]["template"]["metadata"]["annotations"])


async def test_scale_subresource_changes_replicas(kube, operator):
    await create(kube, cr_body())
    await ready_children(kube)
    await patch(kube, f"{BASE}/{NAME}/scale", {"spec": {"replicas": 3}})
    await eventually(lambda: raw(kube, "apps/v1/deployments")["spec"]["replicas"] == 3)
    await eventually(lambda: status_of(kube).get("observedGeneration") == 2)
    scale = await (await kube.get(f"{BASE}/{NAME}/scale")).json()
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    assert scale["status"]["selector"] == status_of(kube)["selector"]
    await patch(kube, f"{BASE}/{NAME}/scale", {"spec": {"replicas": 1}})
    await eventually(lambda: raw(kube, "apps/v1/deployments")["spec"]["replicas"] == 1)
    await eventually(lambda: obj(kube, "policy/v1/poddisruptionbudgets") is None)  # pruned at one replica


async def test_restart_creates_no_duplicates(kube, operator: OperatorRunner):
    await create(kube, cr_body(replicas=2))
    await ready_children(kube)
    await eventually(lambda: raw(kube, "policy/v1/poddisruptionbudgets"))
    before = {k: posts(kube, k) for k in ("/deployments", "/services", "/configmaps",
                                          "/poddisruptionbudgets")}
    n_objects = len([k for k in kube.objects if not kube.objects[k].deleted])
    await operator.stop()
    mark = len(kube._requests)
    await operator.start()
    # The resume handler runs and reads every child back; nothing is created again.
    await eventually(lambda: sum(1 for r in kube._requests[mark:] if r.method == "GET"
                                 and r.url.path.endswith(f"/deployments/{NAME}")) >= 2)
    after = {k: posts(kube, k) for k in before}
    assert after == before == {k: 1 for k in before}
    assert len([k for k in kube.objects if not kube.objects[k].deleted]) == n_objects


async def test_delete_removes_children_and_finalizer(kube, operator):
    await create(kube, cr_body(replicas=2))
    await ready_children(kube)
    assert C.FINALIZER in raw(kube, CR)["metadata"]["finalizers"]
    rsp = await kube.delete(f"{BASE}/{NAME}")
    assert rsp.status == 200
    await eventually(lambda: obj(kube, CR) is None)
    for res in ("apps/v1/deployments", "v1/services", "policy/v1/poddisruptionbudgets", "v1/serviceaccounts"):
        assert obj(kube, res) is None, res
    assert obj(kube, "v1/configmaps", f"{NAME}-config") is None


async def test_conditions_follow_deployment_status(kube, operator):
    await create(kube, cr_body(replicas=2))
    await ready_children(kube)
    key = (kmock.resource("apps/v1/deployments"), NS, NAME)
    gen = raw(kube, "apps/v1/deployments")["metadata"]["generation"]
    kube.objects[key].patch({"status": {"observedGeneration": gen, "replicas": 2, "updatedReplicas": 2,
                                        "readyReplicas": 1, "availableReplicas": 1}})
    await eventually(lambda: cond(status_of(kube), "Progressing")["message"] == "1 of 2 replicas available")
    assert cond(status_of(kube), "Ready")["status"] == "False"
    assert cond(status_of(kube), "Reconciling")["status"] == "True"
    kube.objects[key].patch({"status": {"readyReplicas": 2, "availableReplicas": 2}})
    await eventually(lambda: cond(status_of(kube), "Ready")["status"] == "True")
    st = status_of(kube)
    assert (st["replicas"], st["readyReplicas"]) == (2, 2)
    assert cond(st, "Progressing")["status"] == "False" and cond(st, "Degraded")["status"] == "False"
    assert cond(st, "Stalled")["status"] == "False"
    kube.objects[key].patch({"status": {"conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "chat-1" has timed out progressing.'}]}})
    await eventually(lambda: cond(status_of(kube), "Degraded")["status"] == "True")
    st = status_of(kube)
    assert cond(st, "Degraded")["reason"] == "RolloutFailed" and "timed out" in cond(st,
                                                                                     "Degraded")["message"]
    assert cond(st, "Ready")["status"] == "False" and cond(st, "Stalled")["status"] == "True"
    await eventually(lambda: any(o.raw.get("reason") == "RolloutFailed" for k, o in kube.objects.items()
                                 if k[0] == kmock.resource("v1/events")))


def pod(name: str, feedback: dict | None, phase: str = "Running") -> dict:
    ann = {C.FEEDBACK_ANNOTATION: json.dumps(feedback)} if feedback is not None else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": C.common_labels(NAME), "annotations": ann},
            "spec": {}, "status": {"phase": phase}}


def feedback(cap: int, mark: float, at: dt.datetime, converged: bool, knob: str = "batchCap",
             budget: int = 2048) -> dict:
    ts = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"batchCap": cap, "watermark": mark, "stepTokenBudget": budget, "mode": "enforce",
            "converged": converged,
            "lastDecision": {"knob": knob, "reason": "queue depth above target", "at": ts}, "updatedAt": ts}


async def test_feedback_annotations_aggregated_into_status(kube, operator):
    await create(kube, cr_body(replicas=2))
    await ready_children(kube)
    now = dt.datetime.now(dt.UTC)
    kube.objects["v1/pods", NS, "chat-a"] = pod("chat-a",
                                                feedback(24, 0.4, now - dt.timedelta(seconds=20), True))
    kube.objects["v1/pods", NS, "chat-b"] = pod("chat-b",
                                                feedback(32, 0.5, now - dt.timedelta(seconds=5), False,
                                                                    knob="watermark", budget=512))
    kube.objects["v1/pods", NS, "chat-old"] = pod("chat-old", None, phase="Succeeded")  # not counted
    kube.objects["v1/pods", NS, "other"] = {**pod("other", feedback(1, 0.1, now, True)),
                                           "metadata": {"name": "other", "namespace": NS,
                                                        "labels": {"app": "x"}}}
    fb = await eventually(lambda: status_of(kube).get("feedback", {}).get("reportingPods") == 2
                          and status_of(kube)["feedback"])
    assert fb["convergedPods"] == 1
    assert fb["batchCap"] == {"min": 24, "max": 32} and fb["watermark"] == {"min": 0.4, "max": 0.5}
    assert fb["stepTokenBudget"] == {"min": 512, "max": 2048}
    assert fb["lastDecision"]["pod"] == "chat-b" and fb["lastDecision"]["knob"] == "watermark"
    assert [p["pod"] for p in fb["pods"]] == ["chat-a", "chat-b"]
    assert cond(status_of(kube), "FeedbackHealthy")["status"] == "True"
    await eventually(lambda: any(o.raw.get("reason") == "FeedbackDecision" for k, o in kube.objects.items()
                                 if k[0] == kmock.resource("v1/events")))
    # A pod whose sidecar stopped writing turns FeedbackHealthy False.
    stale = now - dt.timedelta(hours=1)
    kube.objects["v1/pods", NS, "chat-a"].patch(
        {"metadata": {"annotations": {C.FEEDBACK_ANNOTATION: json.dumps(feedback(24, 0.4, stale, True))}}})
    await eventually(lambda: cond(status_of(kube), "FeedbackHealthy")["status"] == "False")
    assert cond(status_of(kube), "FeedbackHealthy")["reason"] == "StaleFeedback"


async def test_unrealisable_spec_is_degraded_not_crashing(kube, operator):
    body = cr_body(engine={"device": "cuda"})
    await create(kube, body)
    st = await eventually(lambda: status_of(kube).get("observedGeneration") == 1 and status_of(kube))
    degraded = cond(st, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "SpecNotRealisable"
    assert "nvidia.com/gpu" in degraded["message"]
    assert obj(kube, "apps/v1/deployments") is None
    # Fixing the spec recovers without a restart.
    await patch(kube, f"{BASE}/{NAME}", {"spec": {"engine": {"device": "cpu"}}})
    await eventually(lambda: raw(kube, "apps/v1/deployments"))
    await eventually(lambda: cond(status_of(kube), "Degraded")["status"] == "False")
    assert operator.task is not None and not operator.task.done()


async def test_invalid_step_budget_is_degraded_with_a_clear_message(kube, operator):
    """Stored without the CRD's rules (kmock validates nothing): the operator refuses to render a sidecar
    file the coordinator could not load, says why, and recovers once the bounds are fixed."""
    await create(kube, cr_body(feedback={"stepTokenBudget": {"min": 1024, "max": 256}}))
    st = await eventually(lambda: status_of(kube).get("observedGeneration") == 1 and status_of(kube))
    degraded = cond(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SpecNotRealisable")
    budget_order = "feedback.stepTokenBudget.min must be <= feedback.stepTokenBudget.max (min 1024, max 256)"
    assert budget_order in degraded["message"]
    assert obj(kube, "v1/configmaps", f"{NAME}-config") is None and obj(kube, "apps/v1/deployments") is None
    await patch(kube, f"{BASE}/{NAME}", {"spec": {"feedback": {"stepTokenBudget": {"min": 128, "max": 1024},
                                                               "targets": {"tpotP50Seconds": 0.05}}}})
    await eventually(lambda: cond(status_of(kube), "Degraded")["status"] == "False")
    sidecar = yaml.safe_load(raw(kube, "v1/configmaps", f"{NAME}-config")["data"]["sidecar.yaml"])
    assert sidecar["step_token_budget"] == {"min": 128, "max": 1024, "max_step": 256}
    assert sidecar["targets"]["tpot_p50_s"] == 0.05 and sidecar["event_path"] == {"enabled": True}


async def test_operator_never_writes_spec(kube, operator):
    await create(kube, cr_body(replicas=2))
    await ready_children(kube)
    await patch(kube, f"{BASE}/{NAME}/scale", {"spec": {"replicas": 3}})
    await eventually(lambda: status_of(kube).get("observedGeneration") == 2)
    mine = [r for r in kube._requests if r.method == "PATCH" and "/inferenceservices/" in r.url.path
            and not r.url.path.endswith("/scale") and r.headers.get("User-Agent", "").startswith("kopf")]
    assert mine, "the operator patched nothing"
    assert all("spec" not in (r.data or {}) for r in mine)
