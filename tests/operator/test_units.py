"""Pure parts: rendering variants, realisability checks, status and feedback computation, the entry point."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import sys

import aiohttp
import pytest
from conftest import eventually

from kvloop.operator import constants as C
from kvloop.operator.kube import KubeConfig, is_subset
from kvloop.operator.render import render_children
from kvloop.operator.spec import problems, with_defaults
from kvloop.operator.status import aggregate_feedback, compute_status, deployment_state


def kinds(spec):
    return {c["kind"]: c for c in render_children("m", "ns", "u", spec)}


def test_model_sources_and_disk_tier_render_volumes():
    pvc = kinds({"model": {"source": "pvc", "pvc": {"claimName": "models"}, "path": "/llama/q8.gguf"},
                 "engine": {"kvCache": {"disk": {"enabled": True, "storage": "pvc", "claimName": "kv"}}}})
    pod = pvc["Deployment"]["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert vols["kv-disk"]["persistentVolumeClaim"]["claimName"] == "kv"
    assert "path: /models/llama/q8.gguf" in pvc["ConfigMap"]["data"]["engine.yaml"]
    empty = kinds({"engine": {"kvCache": {"disk": {"enabled": True, "sizeGiB": 7}}}})
    vols = {v["name"]: v for v in empty["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert vols["kv-disk"]["emptyDir"]["sizeLimit"] == "7Gi" and "model" not in vols
    assert vols["control"]["emptyDir"]["medium"] == "Memory"


def test_the_tpot_target_reaches_the_engine_settings(tmp_path):
    from kvloop.engine.settings_file import load_engine_settings

    for spec, expected in (({"engine": {"scheduler": {"tpotTargetMs": 80}}}, 80.0), ({}, None)):
        path = tmp_path / "engine.yaml"
        path.write_text(kinds(spec)["ConfigMap"]["data"]["engine.yaml"])
        assert load_engine_settings(path)[0].scheduler.tpot_target_ms == expected


def test_gpu_spec_gets_toleration_and_no_surge():
    out = kinds({"resources": {"limits": {"nvidia.com/gpu": 1}}, "engine": {"device": "cuda"}, "replicas": 2,
                 "routing": {"mode": "InferencePool", "inferencePool": {"endpointPicker": {"name": "epp"}}}})
    dep = out["Deployment"]["spec"]
    assert dep["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in dep["template"]["spec"]["tolerations"]
    assert out["InferencePool"]["spec"]["endpointPickerRef"]["name"] == "epp"
    assert out["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == C.selector_labels("m")


def test_problems_found():
    assert problems(with_defaults({})) == []
    assert any("cuda" in p for p in problems(with_defaults({"engine": {"device": "cuda"}})))
    small = with_defaults({"resources": {"limits": {"memory": "256Mi"}}})
    assert any("memory limit" in p for p in problems(small))


def test_is_subset_ignores_server_defaults():
    assert is_subset({"a": {"b": 1}, "l": [{"x": 1}]},
                     {"a": {"b": 1, "c": 2}, "l": [{"x": 1, "y": 0}], "z": 1})
    assert not is_subset({"l": [{"x": 1}]}, {"l": [{"x": 1}, {"x": 2}]})
    assert not is_subset({"a": True}, {"a": 1})


def test_deployment_states():
    assert deployment_state(None, 1)[0] == "Missing"
    d = {"metadata": {"generation": 2}, "status": {"observedGeneration": 1}}
    assert deployment_state(d, 1)[0] == "Progressing"
    d = {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "replicas": 0}}
    assert deployment_state(d, 0)[0] == "Available"  # scaled to zero is a finished rollout


def test_feedback_invalid_and_missing_annotations():
    spec = with_defaults({})
    now = dt.datetime.now(dt.UTC)
    pods = [{"metadata": {"name": "a", "annotations": {C.FEEDBACK_ANNOTATION: "{not json"}},
             "status": {"phase": "Running"}},
            {"metadata": {"name": "b"}, "status": {"phase": "Running"}}]
    _, health = aggregate_feedback(pods, spec, now)
    assert health[:2] == (False, "InvalidAnnotation")
    _, health = aggregate_feedback(pods[1:], spec, now)
    assert health[:2] == (False, "NotReporting")
    _, health = aggregate_feedback(pods, with_defaults({"feedback": {"mode": "off"}}), now)
    assert health[:2] == (True, "FeedbackDisabled")
    good = {"batchCap": 8, "watermark": 0.2, "mode": "enforce", "converged": True, "hitRate": 0.5,
            "updatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    fb, health = aggregate_feedback([{"metadata": {"name": "c",
                                                   "annotations": {C.FEEDBACK_ANNOTATION: json.dumps(good)}},
                                      "status": {"phase": "Running"}}], spec, now)
    assert health[0] is True and fb["hitRate"] == 0.5 and fb["convergedPods"] == 1
    assert "stepTokenBudget" not in fb  # a sidecar from before the knob reports none


def test_feedback_step_budget_aggregated_next_to_the_batch_cap():
    spec = with_defaults({})
    now = dt.datetime.now(dt.UTC)
    ts = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def running(name, **extra):
        value = {"batchCap": 8, "watermark": 0.2, "mode": "enforce", "updatedAt": ts, **extra}
        return {"metadata": {"name": name, "annotations": {C.FEEDBACK_ANNOTATION: json.dumps(value)}},
                "status": {"phase": "Running"}}

    pods = [running("a", stepTokenBudget=512), running("b", stepTokenBudget=2048), running("old")]
    fb, health = aggregate_feedback(pods, spec, now)
    assert health[0] is True
    assert fb["stepTokenBudget"] == {"min": 512, "max": 2048} and fb["batchCap"] == {"min": 8, "max": 8}
    assert [p.get("stepTokenBudget") for p in fb["pods"]] == [512, 2048, None]
    _, health = aggregate_feedback([running("bad", stepTokenBudget="lots")], spec, now)
    assert health[:2] == (False, "InvalidAnnotation")


def sidecar_yaml(spec) -> dict:
    import yaml

    cm = next(c for c in render_children("m", "ns", "u", spec) if c["kind"] == "ConfigMap")
    return yaml.safe_load(cm["data"]["sidecar.yaml"])


def test_sidecar_settings_carry_the_step_budget_tpot_objective_and_event_path():
    default = sidecar_yaml({})
    # the sidecar's own max (8192), which the engine's configured budget (maxNumBatchedTokens) caps; no
    # initial: the coordinator starts from the engine's budget
    assert default["step_token_budget"] == {"min": 64, "max_step": 256}
    assert default["targets"] == {"ttft_p99_s": None, "tpot_p50_s": None, "max_queue_depth": 0}
    assert default["event_path"] == {"enabled": True}
    assert "initial" not in default["batch_cap"] and "initial" not in default["watermark"]
    tuned = sidecar_yaml({"engine": {"scheduler": {"maxNumBatchedTokens": 8192}},
                          "feedback": {"stepTokenBudget": {"min": 256, "max": 4096, "maxStep": 512},
                                       "eventPath": {"enabled": False}, "targets": {"tpotP50Seconds": 0.05}}})
    assert tuned["step_token_budget"] == {"min": 256, "max": 4096, "max_step": 512}
    assert tuned["targets"]["tpot_p50_s"] == 0.05 and tuned["event_path"] == {"enabled": False}
    # No chunked prefill: a prompt must fit one step, so the budget stays the engine's (>= maxModelLen).
    whole = sidecar_yaml({"engine": {"maxModelLen": 4096, "scheduler": {"chunkedPrefill": False}}})
    assert whole["step_token_budget"] == {"min": 4096, "max": 4096, "max_step": 256}


@pytest.mark.parametrize("budget,message", [
    ({"min": 4096, "max": 1024},
     "feedback.stepTokenBudget.min must be <= feedback.stepTokenBudget.max (min 4096, max 1024)"),
    ({"min": 8}, "feedback.stepTokenBudget.min must be at least 16 tokens (it is 8)"),
    ({"maxStep": 0}, "feedback.stepTokenBudget.maxStep must be at least 1 (it is 0)"),
    ({"max": 4096},
     "must not exceed engine.scheduler.maxNumBatchedTokens, the engine's configured budget and the "
                    "ceiling of the live one (max 4096; maxNumBatchedTokens 2048)"),
])
def test_invalid_step_budget_is_a_problem_that_names_the_values(budget, message):
    found = problems(with_defaults({"feedback": {"stepTokenBudget": budget}}))
    assert any(message in p for p in found), found


def test_condition_transition_time_kept_when_status_unchanged():
    spec = with_defaults({})
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    s1 = compute_status(name="m", namespace="ns", spec=spec, deploy=None, pods=[], problems=[],
                        apply_error=None,
                        previous=None, generation=1, observed_generation=1, now=t0)
    s2 = compute_status(name="m", namespace="ns", spec=spec, deploy=None, pods=[], problems=[],
                        apply_error=None,
                        previous=s1, generation=1, observed_generation=1, now=t0 + dt.timedelta(minutes=5))
    assert [c["lastTransitionTime"] for c in s1["conditions"]] == [c["lastTransitionTime"]
                                                                   for c in s2["conditions"]]


def test_kubeconfig_parsing(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("""
apiVersion: v1
kind: Config
current-context: t
contexts: [{name: t, context: {cluster: c, user: u, namespace: team}}]
clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]
users: [{name: u, user: {token: abc}}]
""")
    k = KubeConfig.from_kubeconfig(str(cfg))
    assert (k.server, k.bearer(), k.namespace, k.ssl_context()) == ("http://127.0.0.1:1", "abc", "team",
                                                                    False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.asyncio(loop_scope="session")
async def test_entry_point_runs_operator_with_liveness(kube, tmp_path):
    """`kvloop.operator.main:main` as a process: logs in from a kubeconfig, serves liveness, reconciles."""
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                               "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
                               "clusters": [{"name": "c", "cluster": {"server": str(kube.url).rstrip("/")}}],
                               "users": [{"name": "u", "user": {"token": "t0k"}}]}))
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import sys; from kvloop.operator.main import main; sys.exit(main(sys.argv[1:]))",
        "--kubeconfig", str(cfg), "--liveness", f"http://127.0.0.1:{port}/healthz", "--status-interval",
        "0.5",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, cwd=str(tmp_path))
    try:
        async with aiohttp.ClientSession() as http:
            async def live() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as rsp:
                        return rsp.status == 200
                except aiohttp.ClientError:
                    return False
            ok = False
            for _ in range(150):
                if await live():
                    ok = True
                    break
                await asyncio.sleep(0.1)
            assert ok, "liveness endpoint never answered"
        body = {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": "cli", "namespace": "ns"},
                "spec": {}}
        await kube.post("/apis/kvloop.io/v1alpha1/namespaces/ns/inferenceservices", json=body)
        await eventually(lambda: kube.objects["apps/v1/deployments", "ns", "cli"], timeout=15)
        assert any(r.headers.get("Authorization") == "Bearer t0k" for r in kube._requests)
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("spec", [{}, {"feedback": {"mode": "observe", "intervalSeconds": 10,
                                                    "batchCap": {"min": 4, "max": 128, "maxStep": 16}}},
                                  {"engine": {"scheduler": {"maxNumBatchedTokens": 4096}},
                                   "feedback": {"stepTokenBudget": {"min": 128, "maxStep": 64},
                                                "targets": {"tpotP50Seconds": 0.08}}}])
def test_rendered_sidecar_config_parses_with_the_sidecar(spec):
    settings_mod = pytest.importorskip("kvloop.sidecar.settings", reason="sidecar settings not written yet")
    import yaml

    cm = next(c for c in render_children("m", "ns", "u", spec) if c["kind"] == "ConfigMap")
    parsed = settings_mod.parse_settings(yaml.safe_load(cm["data"]["sidecar.yaml"]))
    full = with_defaults(spec)
    assert parsed.mode == full["feedback"]["mode"]
    assert parsed.period_s == full["feedback"]["intervalSeconds"]
    assert parsed.batch_cap.max == full["feedback"]["batchCap"]["max"]
    assert parsed.annotation_key == C.FEEDBACK_ANNOTATION
    from kvloop.operator.step_budget import resolved
    from kvloop.sidecar.law import ControlLaw

    budget, want = parsed.step_token_budget, resolved(full)
    assert (budget.min, budget.max_step, budget.initial) == (want["min"], want["max_step"], None)
    assert budget.max == want.get("max", settings_mod.Settings().step_token_budget.max)
    # what the coordinator steers within once the engine's snapshot names its configured budget
    law = ControlLaw(parsed)
    ceiling = full["engine"]["scheduler"]["maxNumBatchedTokens"]
    law.reset(engine_budget=ceiling, budget_ceiling=ceiling)
    assert law.budget_bounds.max == ceiling and law.step_token_budget == ceiling
    assert parsed.tpot_p50_s == full["feedback"]["targets"].get("tpotP50Seconds")


def test_owned_kinds_cover_every_rendered_kind():
    """Pruning lists exactly the kinds the renderer can produce (all optional children on)."""
    from kvloop.operator.render import OWNED_KINDS

    spec = {"replicas": 2, "observability": {"serviceMonitor": {"enabled": True}},
            "routing": {"mode": "InferencePool"},
            "engine": {"kvCache": {"remote": {"managed": True, "storage": {"size": "2Gi"}}}}}
    assert {c["kind"] for c in render_children("x", "ns", "uid", spec)} == {kind for _, kind in OWNED_KINDS}


@pytest.mark.parametrize("spec,expected", [
    ({}, []),
    ({"replicas": 2, "resources": {"limits": {"cpu": "1", "memory": 1024}}}, []),
    ("replicas: 2", ["spec must be an object, not string"]),
    ({"replicas": True}, ["spec.replicas must be an integer, not boolean"]),
    ({"replicas": 1.5}, ["spec.replicas must be an integer, not number"]),
    ({"engine": {"kvCache": {"retentionWatermark": "high"}}},
     ["spec.engine.kvCache.retentionWatermark must be a number, not string"]),
    ({"resources": {"limits": {"cpu": [1]}}},
     ["spec.resources.limits.cpu must be an integer or a string, not array"]),
])
def test_shape_problems_name_the_field(spec, expected):
    from kvloop.operator.shape import shape_problems

    assert shape_problems(spec) == expected
