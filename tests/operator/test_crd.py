"""The CRD: generated file in sync, samples valid, invalid custom resources rejected."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import celpy
import pytest
import yaml
from crdcheck import ROOT, all_rules, compile_rule, load_crd, openapi_schema, validate

from kvloop.engine.core.policy import DEFAULT_POLICY, policy_names
from kvloop.operator.crd import render_yaml
from kvloop.operator.limits import is_quantity, parse_quantity
from kvloop.operator.spec import DEFAULTS

SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
CHART_CRD = ROOT / "charts" / "kvloop" / "crds" / "inferenceservices.kvloop.io.yaml"


def test_crd_files_match_generator():
    text = render_yaml()
    assert (ROOT / "manifests" / "base" / "crd.yaml").read_text() == text, "run python -m kvloop.operator.crd"
    assert CHART_CRD.read_text() == text, "charts/kvloop/crds/ is out of date"


def test_scheduler_mode_enum_is_the_policy_registry():
    """The CRD files (rendered by kvloop.operator.crd, checked above) offer exactly the engine's policies."""
    for crd in (load_crd(), load_crd(CHART_CRD)):
        engine = openapi_schema(crd)["properties"]["spec"]["properties"]["engine"]["properties"]
        mode = engine["scheduler"]["properties"]["mode"]
        assert mode["enum"] == list(policy_names())
        assert mode["default"] == DEFAULT_POLICY == DEFAULTS["engine"]["scheduler"]["mode"]


def test_crd_shape():
    crd = load_crd()
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "inferenceservices.kvloop.io"
    assert crd["spec"]["names"]["shortNames"] == ["kvis"]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    cols = [c["name"] for c in version["additionalPrinterColumns"]]
    assert cols == ["Ready", "Replicas", "Hit rate", "Batch cap", "Step budget", "URL", "Age"]
    status = openapi_schema(crd)["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_every_cel_rule_compiles_and_is_checked():
    rules = all_rules(openapi_schema(load_crd()))
    assert len(rules) >= 15
    unchecked = []
    for rule in rules:
        try:
            compile_rule(rule)
        except Exception as exc:  # noqa: BLE001 - report, do not hide
            unchecked.append(f"{rule}: {exc}")
    assert unchecked == [], "CEL rules cel-python cannot evaluate (unchecked):\n" + "\n".join(unchecked)


def test_schema_defaults_match_operator_defaults():
    """The operator fills the same defaults as the API server (for objects that skipped defaulting): the
    schema's defaults, applied to an empty spec, are spec.DEFAULTS, every one of them."""
    from crdcheck import apply_defaults

    assert apply_defaults(openapi_schema(load_crd())["properties"]["spec"], {}) == DEFAULTS


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_are_valid(path: Path):
    for doc in yaml.safe_load_all(path.read_text()):
        assert validate(doc) == []


def base() -> dict:
    return {"apiVersion": "kvloop.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "ok"},
            "spec": {"replicas": 1}}


def with_spec(**spec) -> dict:
    obj = base()
    obj["spec"].update(copy.deepcopy(spec))
    return obj


BUDGET_ORDER = "feedback.stepTokenBudget.min must be <= feedback.stepTokenBudget.max"
INVALID = {
    "negative replicas": (with_spec(replicas=-1), "replicas"),
    "replicas not an integer": (with_spec(replicas="two"), "replicas"),
    "unknown model source": (with_spec(model={"source": "s3"}), "source"),
    "pvc source without claim": (with_spec(model={"source": "pvc", "path": "m.gguf"}), "pvc"),
    "uri source without uri": (with_spec(model={"source": "uri"}), "uri"),
    "uri with a bad scheme": (with_spec(model={"source": "uri", "uri": "ftp://x/m.gguf"}), "uri"),
    "pvc given with embedded source": (with_spec(model={"pvc": {"claimName": "m"}}), "pvc is only used"),
    "block size not a power in the enum": (with_spec(engine={"blockSize": 12}), "blockSize"),
    "unknown scheduler mode": (with_spec(engine={"scheduler": {"mode": "fastest"}}), "mode"),
    "watermark of 1": (with_spec(engine={"kvCache": {"retentionWatermark": 1.0}}), "retentionWatermark"),
    "host gate above device gate": (with_spec(engine={"kvCache": {"admitMinRequests": 1,
                                                                  "hostAdmitMinRequests": 2}}),
                                    "hostAdmitMinRequests"),
    "batch cap min above max": (with_spec(feedback={"batchCap": {"min": 40, "max": 20, "maxStep": 4}}),
                                "batchCap.min must be <= batchCap.max"),
    "watermark bounds reversed": (with_spec(feedback={"watermark": {"min": 0.8, "max": 0.2}}),
                                  "watermark.min must be <= watermark.max"),
    "watermark max of 1": (with_spec(feedback={"watermark": {"max": 1.0}}), "max"),
    "unknown feedback mode": (with_spec(feedback={"mode": "auto"}), "mode"),
    "stale limit below two periods": (with_spec(feedback={"intervalSeconds": 60, "staleAfterSeconds": 90}),
                                      "staleAfterSeconds"),
    "initial watermark outside bounds": (with_spec(feedback={"watermark": {"min": 0.5, "max": 0.8}}),
                                         "retentionWatermark must lie within"),
    "batch cap outside bounds": (with_spec(engine={"scheduler": {"maxNumSeqs": 200}}),
                                 "maxNumSeqs (the engine's batch cap)"),
    "step token budget min above max": (with_spec(feedback={"stepTokenBudget": {"min": 1024, "max": 512}}),
                                        BUDGET_ORDER),
    "step token budget min below 16": (with_spec(feedback={"stepTokenBudget": {"min": 8}}),
                                       "stepTokenBudget.min"),
    "step token budget step of 0": (with_spec(feedback={"stepTokenBudget": {"maxStep": 0}}), "maxStep"),
    "step token budget above the engine's": (with_spec(feedback={"stepTokenBudget": {"max": 4096}}),
                                             "must not exceed engine.scheduler.maxNumBatchedTokens"),
    "tpot objective of 0": (with_spec(feedback={"targets": {"tpotP50Seconds": 0}}), "tpotP50Seconds"),
    "tpot target of 0": (with_spec(engine={"scheduler": {"tpotTargetMs": 0}}), "tpotTargetMs"),
    "gpu requests differ from limits": (with_spec(resources={"requests": {"nvidia.com/gpu": 1},
                                                             "limits": {"nvidia.com/gpu": 2}}),
                                                             "nvidia.com/gpu"),
    "bad memory quantity": (with_spec(resources={"limits": {"memory": "lots"}}), "memory"),
    "disk pvc without claim": (with_spec(engine={"kvCache": {"disk": {"enabled": True, "storage": "pvc"}}}),
                               "claimName"),
    "unknown field": (with_spec(replica=2), "replica"),
    "unknown routing mode": (with_spec(routing={"mode": "RoundRobin"}), "mode"),
    "external picker without name": (with_spec(routing={"mode": "InferencePool",
                                                        "inferencePool": {"endpointPicker": {"port": 9002}}}),
                                     "name"),
    "bad scrape interval": (with_spec(observability={"serviceMonitor": {"enabled": True,
                                                                        "interval": "soon"}}),
                            "interval"),
    "service port out of range": (with_spec(service={"port": 70000}), "port"),
    "name too long": ({**base(), "metadata": {"name": "x" * 53}}, "52 characters"),
}


def test_enough_invalid_cases():
    assert len(INVALID) >= 15


@pytest.mark.parametrize("case", sorted(INVALID), ids=lambda c: c.replace(" ", "-"))
def test_invalid_resources_rejected(case: str):
    obj, expected = INVALID[case]
    errors = validate(obj)
    assert errors, f"{case}: accepted"
    assert any(expected in e for e in errors), f"{case}: {errors}"


def test_minimal_resource_is_valid():
    assert validate(base()) == []
    assert validate({**base(), "spec": {}}) == []


# --- refused at apply time: quantities, requests vs limits, pools vs the memory limit, images, floors ---
# name: (a valid spec, an invalid spec, the message both the CEL rule and the operator's check give)
DIGEST = "sha256:" + "0123456789abcdef" * 4
ADMISSION = {
    "negative cpu request": ({"resources": {"requests": {"cpu": "500m"}}},
                             {"resources": {"requests": {"cpu": "-500m"}}},
                             "resources.requests.cpu must not be negative"),
    "negative memory limit (integer)": ({"resources": {"limits": {"memory": 4 * 2**30}}},
                                        {"resources": {"limits": {"memory": -1}}},
                                        "resources.limits.memory must not be negative"),
    "negative gpu": ({"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}},
                     {"resources": {"limits": {"nvidia.com/gpu": "-1"}}},
                     "resources.limits.nvidia.com/gpu must not be negative"),
    "negative sidecar cpu": ({"sidecarResources": {"requests": {"cpu": "10m"}}},
                             {"sidecarResources": {"requests": {"cpu": "-10m"}}},
                             "sidecarResources.requests.cpu must not be negative"),
    "cpu request above limit": ({"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1500m"}}},
                                {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}},
                                "resources.requests.cpu must not exceed resources.limits.cpu"),
    "memory request above limit": ({"resources": {"requests": {"memory": "4Gi"},
                                                  "limits": {"memory": "4096Mi"}}},
                                   {"resources": {"requests": {"memory": "4.1Gi"},
                                                  "limits": {"memory": "4Gi"}}},
                                   "resources.requests.memory must not exceed resources.limits.memory"),
    "sidecar request above limit": ({"sidecarResources": {"requests": {"memory": "128Mi"},
                                                          "limits": {"memory": "128Mi"}}},
                                    {"sidecarResources": {"requests": {"memory": "256Mi"},
                                                          "limits": {"memory": "128Mi"}}},
                                    "sidecarResources.requests.memory must not exceed "
                                    "sidecarResources.limits.memory"),
    "sidecar memory limit below the floor": ({"sidecarResources": {"limits": {"memory": "96Mi"}}},
                                             {"sidecarResources": {"limits": {"memory": "64Mi"}}},
                                             "sidecarResources.limits.memory must be at least 96Mi"),
    # CPU: the device pool is RAM too. 2048 MiB pool + 1024 MiB headroom > 2Gi.
    "pools above the memory limit": ({"resources": {"limits": {"memory": "3Gi"}},
                                      "engine": {"kvCache": {"devicePoolMiB": 2048, "hostPoolMiB": 0}}},
                                     {"resources": {"limits": {"memory": "2Gi"}},
                                      "engine": {"kvCache": {"devicePoolMiB": 2048, "hostPoolMiB": 0}}},
                                     "must fit the memory limit resources.limits.memory"),
    # With a GPU only the host pool is in RAM.
    "host pool above the memory limit with a GPU": (
        {"resources": {"limits": {"memory": "2Gi", "nvidia.com/gpu": 1}},
         "engine": {"kvCache": {"devicePoolMiB": 8192, "hostPoolMiB": 1024}}},
        {"resources": {"limits": {"memory": "2Gi", "nvidia.com/gpu": 1}},
         "engine": {"kvCache": {"devicePoolMiB": 8192, "hostPoolMiB": 2048}}},
        "must fit the memory limit resources.limits.memory"),
    # No spec.resources: the engine gets the default 4Gi limit; the default 1,440 MiB device pool + 1024 MiB
    # headroom leave 1,632 MiB for the host pool.
    "pools above the default memory limit": ({"engine": {"kvCache": {"hostPoolMiB": 1632}}},
                                             {"engine": {"kvCache": {"hostPoolMiB": 1633}}},
                                             "must fit the default memory limit 4Gi"),
    "image with spaces": ({"images": {"engine": "ghcr.io/kvloop/kvloop:0.1.0"}},
                          {"images": {"engine": "ghcr.io/kvloop/kvloop 0.1.0"}},
                          "images.engine must be an image"),
    "image with an upper-case path": ({"images": {"sidecar": "localhost:5000/team/kvloop@" + DIGEST}},
                                      {"images": {"sidecar": "localhost:5000/Team/kvloop"}},
                                      "images.sidecar must be an image"),
    "image with two tags": ({"images": {"fetcher": "busybox:1.36"}},
                            {"images": {"fetcher": "busybox:1.36:musl"}},
                            "images.fetcher must be an image"),
    "image with a short digest": ({"images": {"engine": "kvloop@" + DIGEST}},
                                  {"images": {"engine": "kvloop@sha256:abc"}},
                                  "images.engine must be an image"),
    "step token budget min above max": ({"feedback": {"stepTokenBudget": {"min": 512, "max": 1024}}},
                                        {"feedback": {"stepTokenBudget": {"min": 1024, "max": 512}}},
                                        BUDGET_ORDER),
    "step token budget above the engine's budget": (
        {"engine": {"scheduler": {"maxNumBatchedTokens": 8192}},
         "feedback": {"stepTokenBudget": {"max": 8192}}},
        {"engine": {"scheduler": {"maxNumBatchedTokens": 4096}},
         "feedback": {"stepTokenBudget": {"max": 8192}}},
        "feedback.stepTokenBudget bounds must not exceed engine.scheduler.maxNumBatchedTokens"),
    "step token budget min above the engine's budget": (
        {"engine": {"scheduler": {"maxNumBatchedTokens": 512}},
         "feedback": {"stepTokenBudget": {"min": 512}}},
        {"engine": {"scheduler": {"maxNumBatchedTokens": 256}},
         "feedback": {"stepTokenBudget": {"min": 512}}},
        "feedback.stepTokenBudget bounds must not exceed engine.scheduler.maxNumBatchedTokens"),
}


@pytest.mark.parametrize("case", sorted(ADMISSION), ids=lambda c: c.replace(" ", "-"))
def test_admission_rule_refuses_the_invalid_and_accepts_the_valid(case: str):
    valid, invalid, message = ADMISSION[case]
    assert validate(with_spec(**valid)) == [], case
    errors = validate(with_spec(**invalid))
    assert any(message in e for e in errors), f"{case}: {errors}"


@pytest.mark.parametrize("case", sorted(ADMISSION), ids=lambda c: c.replace(" ", "-"))
def test_operator_reports_what_the_crd_refuses(case: str):
    """Objects stored before the rules existed: the operator's Degraded message says the same thing."""
    from kvloop.operator.spec import problems, with_defaults

    valid, invalid, message = ADMISSION[case]
    assert not any(message in p for p in problems(with_defaults(valid))), case
    assert any(message in p for p in problems(with_defaults(invalid))), case


@pytest.mark.parametrize("text,value", [
    ("1", 1), ("+1", 1), ("-1", -1), ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)),
    ("5.", 5), ("1k", 1000), ("1Ki", 1024), ("4Gi", 4 * 2**30), ("1.5Gi", 3 * 2**29),
    ("100n", Fraction(1, 10**7)),
    ("3u", Fraction(3, 10**6)), ("1e3", 1000), ("1E-3", Fraction(1, 1000)), ("2M", 2 * 10**6), ("1Ei", 2**60),
    (7, 7),
])
def test_quantity_parser_follows_kubernetes(text, value):
    assert parse_quantity(text) == value
    # The CRD's rules take int-or-string values as quantity(string(...)): the integer 7 goes through '7'.
    assert compile_rule(f"quantity('{text}').compareTo(quantity('{text}')) == 0").evaluate({})


@pytest.mark.parametrize("text",
                         ["", "Gi", "1GB", "1.5.5", "1 Gi", "1K", "1gi", "--1", "1e", "1e1.5", "0x10", True])
def test_quantity_parser_refuses_what_kubernetes_refuses(text):
    with pytest.raises(ValueError):
        parse_quantity(text)
    assert not is_quantity(text)


def test_cel_quantity_library():
    def ev(rule: str):
        return compile_rule(rule).evaluate({})
    assert ev("quantity('1Gi').isGreaterThan(quantity('1000Mi'))")
    assert ev("quantity('999m').isLessThan(quantity('1'))")
    assert ev("quantity('-2').sign() == -1") and ev("quantity('0').sign() == 0")
    assert ev("isQuantity('250Mi')") and not ev("isQuantity('250MB')")
    assert ev("quantity('1Ki').asInteger() == 1024") and ev("!quantity('1500m').isInteger()")
    assert ev("quantity('1').add(quantity('500m')).compareTo(quantity('1.5')) == 0")
    assert ev("quantity('2').sub(1).asInteger() == 1") and ev("quantity('1500m').asApproximateFloat() == 1.5")
    with pytest.raises(celpy.CELEvalError):  # an evaluation error (the object is refused), as in Kubernetes
        ev("quantity('1.5.5').sign()")


def _every_resource_rule():
    """(valid spec, invalid spec, message) for every generated quantity rule: both containers, both
    parts, every checked resource; GPUs requested equal to their limits as the CRD demands."""
    from kvloop.operator import limits as L

    def res(field, requests=None, limits=None):
        return {field: {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}}

    for field in ("resources", "sidecarResources"):
        for key in L.CHECKED_RESOURCES:
            both = key == "nvidia.com/gpu"  # requests must equal limits: set both
            for part in ("requests", "limits"):
                value = {key: "8Gi"} if not both else {key: 1}
                bad = {key: "-8Gi"} if not both else {key: -1}
                yield (f"{field}.{part}.{key} negative",
                       res(field, **{part: value, **({"limits" if part == "requests" else "requests": value}
                                                     if both else {})}),
                       res(field, **{part: bad, **({"limits" if part == "requests" else "requests": bad}
                                                   if both else {})}),
                       L.negative_message(field, part, key))
            if not both:
                yield (f"{field}.requests.{key} above limit", res(field, {key: "4Gi"}, {key: "8Gi"}),
                       res(field, {key: "9Gi"}, {key: "8Gi"}), L.above_limit_message(field, key))


@pytest.mark.parametrize("case", list(_every_resource_rule()), ids=lambda c: c[0].replace(" ", "-"))
def test_every_generated_resource_rule_has_its_operator_twin(case):
    from kvloop.operator.spec import problems, with_defaults

    _, valid, invalid, message = case
    assert validate(with_spec(**valid)) == []
    assert any(message in e for e in validate(with_spec(**invalid)))
    assert not any(message in p for p in problems(with_defaults(valid)))
    assert any(message in p for p in problems(with_defaults(invalid)))


# --- the step token budget: derived bounds keep every stored object valid; chunking off pins it ---

@pytest.mark.parametrize("tokens", [16, 48, 2048, 16384, 1048576])
def test_step_budget_bounds_derive_from_the_engine_budget(tokens: int):
    """An object written before the knob existed, whatever its maxNumBatchedTokens, stays valid; the
    rendered bounds keep the sidecar's max where the engine's budget (the ceiling) lies below it, and a min at
    or below the budget."""
    from kvloop.operator.spec import problems, with_defaults
    from kvloop.operator.step_budget import DEFAULT_MAX, DEFAULT_MIN, resolved

    spec = {"engine": {"scheduler": {"maxNumBatchedTokens": tokens}}}
    assert validate(with_spec(**spec)) == []
    full = with_defaults(spec)
    assert problems(full) == []
    b = resolved(full)
    above = {"max": tokens} if tokens > DEFAULT_MAX else {}  # else the sidecar's own, which the budget caps
    assert b == {"min": min(DEFAULT_MIN, tokens), "max_step": 256, **above}


def test_step_budget_without_chunked_prefill_is_pinned():
    from kvloop.operator.spec import problems, with_defaults
    from kvloop.operator.step_budget import resolved

    spec = {"engine": {"maxModelLen": 4096,
                       "scheduler": {"chunkedPrefill": False, "maxNumBatchedTokens": 1024}},
            "feedback": {"stepTokenBudget": {"min": 2048, "max": 8192}}}
    assert validate(with_spec(**spec)) == []  # the bounds do not apply: nothing to refuse
    full = with_defaults(spec)
    assert problems(full) == []
    assert resolved(full) == {"min": 4096, "max": 4096, "max_step": 256}


def test_step_budget_explicit_max_below_engine_budget_starts_there():
    from kvloop.operator.spec import with_defaults
    from kvloop.operator.step_budget import resolved

    full = with_defaults({"engine": {"scheduler": {"maxNumBatchedTokens": 8192}},
                          "feedback": {"stepTokenBudget": {"max": 40, "maxStep": 8}}})
    assert resolved(full) == {"min": 40, "max": 40, "max_step": 8}  # the coordinator clamps the engine's 8192
