"""The CRD: generated file in sync, samples valid, invalid custom resources rejected."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from crdcheck import ROOT, all_rules, compile_rule, load_crd, openapi_schema, validate
from kvloop.operator.crd import render_yaml
from kvloop.operator.spec import DEFAULTS

SAMPLES = sorted((ROOT / "manifests" / "samples").glob("*.yaml"))
CHART_CRD = ROOT / "charts" / "kvloop" / "crds" / "inferenceservices.kvloop.io.yaml"


def test_crd_files_match_generator():
    text = render_yaml()
    assert (ROOT / "manifests" / "base" / "crd.yaml").read_text() == text, "run python -m kvloop.operator.crd"
    assert CHART_CRD.read_text() == text, "charts/kvloop/crds/ is out of date"


def test_crd_shape():
    crd = load_crd()
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "inferenceservices.kvloop.io"
    assert crd["spec"]["names"]["shortNames"] == ["kvis"]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    cols = [c["name"] for c in version["additionalPrinterColumns"]]
    assert cols == ["Ready", "Replicas", "Hit rate", "Batch cap", "URL", "Age"]
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
    """The operator fills the same defaults as the API server (for objects that skipped defaulting)."""
    from crdcheck import apply_defaults

    defaulted = apply_defaults(openapi_schema(load_crd())["properties"]["spec"], {})
    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items()}
    for path in [("replicas",), ("engine", "blockSize"), ("engine", "kvCache", "admitMinRequests"),
                 ("feedback", "intervalSeconds"), ("feedback", "watermark", "max"), ("service", "port"),
                 ("engine", "scheduler", "mode"), ("feedback", "batchCap", "max")]:
        a, b = defaulted, DEFAULTS
        for key in path:
            a, b = a[key], b[key]
        assert a == b, path


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
    "host gate above device gate": (with_spec(engine={"kvCache": {"admitMinRequests": 1, "hostAdmitMinRequests": 2}}),
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
    "initial batch cap outside bounds": (with_spec(engine={"scheduler": {"maxNumSeqs": 200}}),
                                         "maxNumSeqs (the initial batch cap)"),
    "gpu requests differ from limits": (with_spec(resources={"requests": {"nvidia.com/gpu": 1},
                                                             "limits": {"nvidia.com/gpu": 2}}), "nvidia.com/gpu"),
    "bad memory quantity": (with_spec(resources={"limits": {"memory": "lots"}}), "memory"),
    "disk pvc without claim": (with_spec(engine={"kvCache": {"disk": {"enabled": True, "storage": "pvc"}}}),
                               "claimName"),
    "unknown field": (with_spec(replica=2), "replica"),
    "inference pool without picker": (with_spec(routing={"inferencePool": {"enabled": True}}), "endpointPicker"),
    "bad scrape interval": (with_spec(observability={"serviceMonitor": {"enabled": True, "interval": "soon"}}),
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
