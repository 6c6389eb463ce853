"""Helm chart and kustomize overlays: lint, render, and validate every object offline.

Built-in kinds are checked with kubernetes-validate (strict: unknown fields fail) for Kubernetes
1.29 and 1.37; InferenceServices against our CRD; third-party kinds (Prometheus Operator, Gateway
API Inference Extension, kopf) have no schema offline and get a structural check only.
"""

from __future__ import annotations

import subprocess

import kubernetes_validate
import pytest
import yaml
from crdcheck import ROOT, validate

from kvloop.operator.render import render_children

CHART = ROOT / "charts" / "kvloop"
VALUES = sorted((CHART / "examples").glob("*.yaml"))
OVERLAYS = [ROOT / "manifests" / "base", ROOT / "manifests" / "overlays" / "dev",
            ROOT / "manifests" / "overlays" / "prod", ROOT / "manifests" / "monitoring"]
K8S_VERSIONS = ["1.29", "1.37"]
THIRD_PARTY = {"monitoring.coreos.com/v1": {"PodMonitor", "PrometheusRule", "ServiceMonitor"},
               "inference.networking.k8s.io/v1": {"InferencePool"}}


def run(cmd: list, timeout: float = 60) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}\n{proc.stdout}"
    return proc.stdout


def docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def check_objects(objs: list[dict]) -> None:
    assert objs
    for obj in objs:
        api, kind = obj["apiVersion"], obj["kind"]
        where = f"{kind}/{obj['metadata'].get('name')}"
        if api == "kvloop.io/v1alpha1":
            assert validate(obj) == [], where
        elif kind in THIRD_PARTY.get(api, set()):
            assert obj["metadata"]["name"] and isinstance(obj.get("spec"), dict), where
        elif api == "kopf.dev/v1":  # kopf's peering objects: a name, and no spec at all
            assert kind in ("ClusterKopfPeering", "KopfPeering") and obj["metadata"]["name"], where
        else:
            for version in K8S_VERSIONS:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{where} invalid for Kubernetes {version}: {exc.message}")


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
def test_helm_lint_strict(k8s_tools, helm):
    run([k8s_tools[helm], "lint", "--strict", CHART])
    for values in VALUES:
        run([k8s_tools[helm], "lint", "--strict", CHART, "-f", values])


@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda v: v.name if v else "default")
def test_helm_template_validates(k8s_tools, values):
    for helm in ("helm3", "helm4"):
        cmd = [k8s_tools[helm], "template", "kvloop", CHART, "--namespace", "kvloop-system", "--include-crds"]
        objs = docs(run(cmd + (["-f", values] if values else [])))
        check_objects(objs)
        kinds = {o["kind"] for o in objs}
        assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "ServiceAccount"} <= kinds


def test_helm_template_default_has_no_monitoring(k8s_tools):
    objs = docs(run([k8s_tools["helm4"], "template", "kvloop", CHART]))
    assert not {o["kind"] for o in objs} & {"PodMonitor", "PrometheusRule", "ConfigMap"}
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    assert deploy["spec"]["strategy"]["type"] == "Recreate" and deploy["spec"]["replicas"] == 1


def test_helm_refuses_replicas_without_peering(k8s_tools):
    proc = subprocess.run([str(k8s_tools["helm4"]), "template", "x", str(CHART), "--set",
                           "operator.replicas=2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "peering" in proc.stderr


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: p.relative_to(ROOT / "manifests").as_posix())
def test_kustomize_overlays_validate(k8s_tools, path):
    objs = docs(run([k8s_tools["kubectl"], "kustomize", path]))
    check_objects(objs)


def test_dashboard_configmap_labelled_for_grafana(k8s_tools):
    objs = docs(run([k8s_tools["kubectl"], "kustomize", ROOT / "manifests" / "monitoring"]))
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["kvloop.json"] == (ROOT / "manifests" / "monitoring" / "dashboard.json").read_text()


def test_chart_files_are_copies_of_manifests():
    for name in ("dashboard.json", "prometheusrule.yaml", "podmonitor.yaml"):
        monitoring = ROOT / "manifests" / "monitoring" / name
        assert (CHART / "files" / name).read_text() == monitoring.read_text(), name


def test_chart_rbac_matches_kustomize_rbac():
    base = next(d for d in docs((ROOT / "manifests" / "base" / "rbac.yaml").read_text()) if d["kind"]
                == "ClusterRole")
    text = (CHART / "templates" / "rbac.yaml").read_text()
    for rule in base["rules"]:
        for resource in rule["resources"]:
            assert resource in text


@pytest.mark.parametrize("path", sorted((ROOT / "manifests" / "samples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_operator_children_of_samples_validate(path):
    """What the operator would create for each sample is itself valid for both Kubernetes versions."""
    sample = yaml.safe_load(path.read_text())
    children = render_children(sample["metadata"]["name"], "default", "0000-uid", sample["spec"])
    check_objects(children)
    deploy = next(c for c in children if c["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
def test_chart_inference_services_render_valid_children(k8s_tools, helm):
    """The chart's InferenceServices from values (examples/fleet-values.yaml: 3 replicas, a managed Valkey
    store, an InferencePool with its picker): valid against the CRD, and every child the operator renders
    for them (StatefulSet with its claim template, PDBs, Secret, picker Deployment, ...) valid for both
    Kubernetes versions, every container of them restricted."""
    objs = docs(run([k8s_tools[helm], "template", "kvloop", CHART, "--namespace", "team",
                     "-f", CHART / "examples" / "fleet-values.yaml"]))
    services = [o for o in objs if o["kind"] == "InferenceService"]
    assert [(s["metadata"]["name"], s["metadata"]["namespace"]) for s in services] == [("fleet", "team")]
    check_objects(services)
    children = render_children("fleet", "team", "0000-uid", services[0]["spec"])
    check_objects(children)
    kinds = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert {("StatefulSet", "fleet-kv"), ("PodDisruptionBudget", "fleet-kv"), ("Secret", "fleet-kv-password"),
            ("InferencePool", "fleet"), ("Deployment", "fleet-epp"),
            ("PodDisruptionBudget", "fleet")} <= kinds
    for c in children:
        if c["kind"] in ("Deployment", "StatefulSet"):
            for container in c["spec"]["template"]["spec"]["containers"]:
                sc = container["securityContext"]
                assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], c["metadata"]
    assert not [o for o in docs(run([k8s_tools[helm], "template", "kvloop", CHART]))
                if o["kind"] == "InferenceService"]  # none by default


def test_argocd_health_script_in_sync():
    lua = (ROOT / "manifests" / "argocd" / "health-inferenceservice.lua").read_text()
    cm = yaml.safe_load((ROOT / "manifests" / "argocd" / "argocd-cm-patch.yaml").read_text())
    assert cm["data"]["resource.customizations.health.kvloop.io_InferenceService"] == lua


def _lua_health(obj: dict) -> dict:
    lupa = pytest.importorskip("lupa")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)

    def to_lua(v):
        if isinstance(v, dict):
            return lua.table_from({k: to_lua(x) for k, x in v.items()})
        if isinstance(v, list):
            return lua.table_from([to_lua(x) for x in v])
        return v

    script = (ROOT / "manifests" / "argocd" / "health-inferenceservice.lua").read_text()
    fn = lua.eval("function(obj) " + script + " end")
    out = fn(to_lua(obj))
    return {"status": out["status"], "message": out["message"]}


@pytest.mark.parametrize("status,generation,expected", [
    (None, 1, "Progressing"),
    ({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False"},
                                              {"type": "Progressing", "status": "True",
                                               "message": "1 of 2"}]}, 1, "Progressing"),
    ({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True", "message": "2 of 2"},
                                              {"type": "Degraded", "status": "False"}]}, 1, "Healthy"),
    ({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}, 2, "Progressing"),
    ({"observedGeneration": 3, "conditions": [{"type": "Degraded", "status": "True", "message": "no gpu"}]},
     3, "Degraded"),
])
def test_argocd_health_script(status, generation, expected):
    obj = {"metadata": {"generation": generation}}
    if status is not None:
        obj["status"] = status
    assert _lua_health(obj)["status"] == expected


def test_gpu_sample_memory_adds_up():
    """The GPU sample's sizing comment, recomputed: model (bf16) + host pool + headroom <= memory limit,
    and on the device model + device pool fits an 80 GB GPU. The claim's access mode is stated."""
    from kvloop.operator.spec import quantity

    text = (ROOT / "manifests" / "samples" / "gpu.yaml").read_text()
    spec = yaml.safe_load(text)["spec"]
    assert spec["engine"]["dtype"] == "bfloat16" and "8b" in spec["model"]["name"]
    gib = 2**30
    model = 8.03e9 * 2  # Llama-3.1-8B parameters x bytes per bfloat16 weight
    kv = spec["engine"]["kvCache"]
    headroom = 8 * gib
    assert model + kv["hostPoolMiB"] * 2**20 + headroom <= quantity(spec["resources"]["limits"]["memory"])
    assert model + kv["devicePoolMiB"] * 2**20 <= 76 * gib  # 80 GB GPU less the CUDA context
    assert "ReadOnlyMany" in text and "ReadWriteOnce" in text
    assert spec["model"]["pvc"].get("readOnly", True)
