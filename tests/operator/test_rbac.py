"""The operator's RBAC grants every verb it uses on every resource, measured, not listed by hand.

The real operator runs a full life cycle against the fake API server (create with every optional
child, spec changes that prune them, scale, delete) with peering, and once with a namespace glob.
Every request it made becomes (API group, resource[/subresource], verb), which the ClusterRole of
manifests/base and of the rendered Helm chart must allow. Children with `blockOwnerDeletion` also
need `update` on the owner's `finalizers` subresource, which no request shows.
"""

from __future__ import annotations

import subprocess

import kmock
import pytest
import yaml
from conftest import ROOT, eventually
from test_cli_variants import PEERINGS
from test_e2e import BASE, CR, NAME, cr_body, obj, status_of
from test_namespaces import operator_cli
from test_prune import POOLS

from kvloop.operator import constants as C
from kvloop.operator.render import render_children

CHART = ROOT / "charts" / "kvloop"
TEST_AGENT = {"User-Agent": "kvloop-test"}  # the test's own requests, told apart from the operator's
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def needed(path: str, method: str, query: dict) -> tuple[str, str, str] | None:
    """(group, resource[/sub], verb) of one request; None for discovery (allowed to every account)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return None
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else ("get" if name else "list")
    else:
        verb = VERBS[method]
    return group, f"{resource}/{sub}" if sub else resource, verb


def operator_needs(kube) -> set[tuple[str, str, str]]:
    out = set()
    for r in kube._requests:
        if r.headers.get("User-Agent") == TEST_AGENT["User-Agent"]:
            continue
        need = needed(r.url.path, r.method, dict(r.url.query))
        if need:
            out.add(need)
        data = r.data if isinstance(r.data, dict) else {}
        for ref in (data.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("blockOwnerDeletion") and ref.get("kind") == C.KIND:
                out.add((C.GROUP, f"{C.PLURAL}/finalizers", "update"))
    return out


def allowed(rules: list[dict], need: tuple[str, str, str]) -> bool:
    group, resource, verb = need
    return any(group in r.get("apiGroups", []) and resource in r.get("resources",
                                                                     []) and verb in r.get("verbs", [])
               for r in rules)


def cluster_role(objs: list[dict]) -> list[dict]:
    return next(o for o in objs if o["kind"] == "ClusterRole")["rules"]


def base_rules() -> list[dict]:
    return cluster_role(list(yaml.safe_load_all((ROOT / "manifests" / "base" / "rbac.yaml").read_text())))


def chart_rules(tools, *args: str) -> list[dict]:
    out = subprocess.run([str(tools["helm4"]), "template", "kvloop", str(CHART), *args], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return cluster_role([d for d in yaml.safe_load_all(out) if d])


async def send(kube, method: str, path: str, body: dict) -> None:
    headers = {**TEST_AGENT, "Content-Type": "application/merge-patch+json"}
    rsp = await kube.request(method, path, json=body, headers=headers)
    assert rsp.status in (200, 201), await rsp.text()


def serve_optional_kinds(kube) -> None:
    verbs = {"get", "list", "watch", "create", "patch", "delete"}
    kube.resources[POOLS] = kmock.ResourceInfo(kind="InferencePool", singular="inferencepool",
                                               namespaced=True,
                                               verbs=verbs)
    for kind, res in PEERINGS.items():
        kube.resources[res] = kmock.ResourceInfo(kind=kind, singular=kind.lower(),
                                                 namespaced=kind == "KopfPeering",
                                                 verbs=verbs)


@pytest.mark.asyncio(loop_scope="session")
async def test_rbac_covers_a_full_life_cycle_with_peering(kube, tmp_path, k8s_tools):
    serve_optional_kinds(kube)
    await send(kube, "POST", "/apis/kopf.dev/v1/clusterkopfpeerings",
               {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "kvloop"}})
    async with operator_cli(kube, tmp_path, "--peering=kvloop"):
        await send(kube, "POST", BASE,
                   cr_body(replicas=2, observability={"serviceMonitor": {"enabled": True}},
                           routing={"mode": "InferencePool"},
                           engine={"kvCache": {"remote": {"managed": True, "storage": {"size": "2Gi"}}}}))
        await eventually(lambda: status_of(kube).get("observedGeneration") == 1, timeout=20)
        await send(kube, "PATCH", f"{BASE}/{NAME}",
                   {"spec": {"observability": {"serviceMonitor": {"enabled": False}},
                             "routing": {"mode": "none"},
                             "engine": {"kvCache": {"remote": None}}}})
        await send(kube, "PATCH", f"{BASE}/{NAME}/scale", {"spec": {"replicas": 1}})
        await eventually(lambda: obj(kube, "policy/v1/poddisruptionbudgets") is None, timeout=20)
        await eventually(lambda: obj(kube, POOLS) is None)
        await eventually(lambda: obj(kube, "apps/v1/statefulsets", f"{NAME}-kv") is None)
        await send(kube, "DELETE", f"{BASE}/{NAME}", {})
        await eventually(lambda: obj(kube, CR) is None, timeout=20)
    needs = operator_needs(kube)
    for must in [("apps", "deployments", "delete"), ("policy", "poddisruptionbudgets", "list"),
                 ("inference.networking.k8s.io", "inferencepools", "delete"),
                 ("apps", "statefulsets", "delete"), ("", "secrets", "create"),
                 ("kopf.dev", "clusterkopfpeerings", "patch"),
                 (C.GROUP, f"{C.PLURAL}/status", "patch"), (C.GROUP, f"{C.PLURAL}/finalizers", "update")]:
        assert must in needs, (must, sorted(needs))  # the scenario really exercised it
    # RBAC forbids granting what one does not hold: the per-service Role's rules count too.
    for role in (c for c in render_children(NAME, "ns", "uid", {"routing": {"mode": "InferencePool"}})
                 if c["kind"] == "Role"):  # the sidecar's and the endpoint picker's
        needs |= {(g, res, v) for rule in role["rules"] for g in rule["apiGroups"]
                  for res in rule["resources"] for v in rule["verbs"]}
    for name, rules in [("manifests/base", base_rules()),
                        ("chart prod-values",
                         chart_rules(k8s_tools, "-f", str(CHART / "examples" / "prod-values.yaml")))]:
        missing = sorted(n for n in needs if not allowed(rules, n))
        assert not missing, f"{name} ClusterRole lacks {missing}"


@pytest.mark.asyncio(loop_scope="session")
async def test_rbac_covers_namespace_globs(kube, tmp_path, k8s_tools):
    await send(kube, "POST", "/api/v1/namespaces",
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    async with operator_cli(kube, tmp_path, "--namespace=team-*"):
        await send(kube, "POST", f"/apis/{C.API_VERSION}/namespaces/team-a/inferenceservices",
                   {**cr_body(), "metadata": {"name": "chat", "namespace": "team-a"}})
        await eventually(lambda: obj(kube, "apps/v1/deployments", "chat", "team-a"))
    needs = operator_needs(kube)
    assert ("", "namespaces", "watch") in needs
    glob_rules = chart_rules(k8s_tools, "--set", "operator.watchNamespaces={team-*}")
    assert not sorted(n for n in needs if not allowed(glob_rules, n))
    exact_rules = chart_rules(k8s_tools, "--set", "operator.watchNamespaces={team-a}")
    assert not allowed(exact_rules, ("", "namespaces", "list"))  # exact names: not granted, not needed


def test_chart_creates_a_peering_object_per_exact_namespace(k8s_tools):
    out = subprocess.run([str(k8s_tools["helm4"]), "template", "kvloop", str(CHART), "--set",
                          "operator.peering.enabled=true",
                          "--set", "operator.watchNamespaces={a,b-*}"], capture_output=True, text=True,
                          timeout=60,
                         check=True).stdout
    peerings = [d for d in yaml.safe_load_all(out) if d and d["kind"] in PEERINGS]
    assert [(p["kind"], p["metadata"].get("namespace")) for p in peerings] == [("KopfPeering", "a")]


def test_peering_crds_are_the_same_in_chart_and_overlay():
    chart = (CHART / "crds" / "kopfpeerings.kopf.dev.yaml").read_text()
    assert chart == (ROOT / "manifests" / "overlays" / "prod" / "kopf-peering-crds.yaml").read_text()
