"""spec.engine.kvCache.remote, spec.routing and spec.engine.speculation, rendered (pure): the managed Valkey
store's objects, the engine's settings and password variable, the InferencePool with its endpoint picker;
every bad combination refused by the schema's CEL rule and reported as Degraded with the same words."""

from __future__ import annotations

import pytest
import yaml
from crdcheck import validate
from test_crd import with_spec

from kvloop.engine.core import defaults as D
from kvloop.engine.settings_file import load_engine_settings
from kvloop.operator import constants as C
from kvloop.operator import remote_store as RS
from kvloop.operator.render import render_children
from kvloop.operator.routing import picker_selector
from kvloop.operator.spec import problems, with_defaults

MANAGED = {"managed": True, "storage": {"size": "4Gi"}, "maxMemory": "2Gi"}
BOTH = {"replicas": 3, "engine": {"kvCache": {"remote": MANAGED}}, "routing": {"mode": "InferencePool"}}


def children(spec: dict) -> dict[tuple[str, str], dict]:
    out = render_children("chat", "ns", "uid", spec, new_password=lambda: "generated")
    return {(c["kind"], c["metadata"]["name"]): c for c in out}


def engine_yaml(spec: dict) -> dict:
    return yaml.safe_load(children(spec)[("ConfigMap", "chat-config")]["data"]["engine.yaml"])


def engine_container(spec: dict) -> dict:
    return children(spec)[("Deployment", "chat")]["spec"]["template"]["spec"]["containers"][0]


def test_managed_store_renders_a_valkey_statefulset_with_its_claim_service_budget_and_password():
    out = children(BOTH)
    sts = out[("StatefulSet", "chat-kv")]["spec"]
    assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "4Gi"
    (valkey,) = sts["template"]["spec"]["containers"]
    assert valkey["image"] == C.VALKEY_IMAGE and ":" in valkey["image"].rsplit("/", 1)[1]  # a pinned tag
    assert valkey["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "chat-kv-password", "key": "password"}
    conf = out[("ConfigMap", "chat-kv-config")]["data"]["valkey.conf"].splitlines()
    assert f"maxmemory {2 * 2**30}" in conf and "maxmemory-policy allkeys-lru" in conf
    assert out[("Secret", "chat-kv-password")]["stringData"] == {"password": "generated"}
    assert out[("Secret", "chat-kv-password")]["metadata"]["annotations"] == {RS.CREATE_ONLY: "true"}
    assert out[("Service", "chat-kv")]["spec"]["selector"] == sts["selector"]["matchLabels"]
    assert out[("PodDisruptionBudget", "chat-kv")]["spec"]["selector"] == sts["selector"]
    # the store's pods are not the engine's: neither its Service nor its Deployment selects them
    engine_selector = C.selector_labels("chat").items()
    assert not engine_selector <= sts["template"]["metadata"]["labels"].items()
    # the engine finds it by URL (engine.yaml) and its password in the environment, never in the file
    assert engine_yaml(BOTH)["kv_cache"]["remote_url"] == f"redis://chat-kv:{C.VALKEY_PORT}/0"
    env = {e["name"]: e for e in engine_container(BOTH)["env"]}
    assert env[C.KV_REMOTE_PASSWORD_ENV]["valueFrom"]["secretKeyRef"] == {"name": "chat-kv-password",
                                                                         "key": "password"}


def test_a_referenced_secret_replaces_the_generated_one():
    ref = {"name": "store-auth", "key": "pw"}
    spec = {"engine": {"kvCache": {"remote": {**MANAGED, "passwordSecretRef": ref}}}}
    out = children(spec)
    assert not any(kind == "Secret" for kind, _ in out)
    assert out[("StatefulSet", "chat-kv")]["spec"]["template"]["spec"]["containers"][0]["env"][0][
        "valueFrom"]["secretKeyRef"] == ref
    password_env = {"name": C.KV_REMOTE_PASSWORD_ENV, "valueFrom": {"secretKeyRef": ref}}
    assert password_env in engine_container(spec)["env"]


def test_an_existing_store_gets_its_url_and_timeout_and_no_store_objects():
    ref = {"name": "redis", "key": "password"}
    spec = {"engine": {"kvCache": {"remote": {"url": "rediss://cache.example:6380/2", "timeoutMs": 40,
                                              "passwordSecretRef": ref}}}}
    assert validate(with_spec(**spec)) == [] and problems(with_defaults(spec)) == []
    kv = engine_yaml(spec)["kv_cache"]
    assert (kv["remote_url"], kv["remote_timeout_ms"]) == ("rediss://cache.example:6380/2", 40)
    assert not {kind for kind, _ in children(spec)} & {"StatefulSet", "Secret"}
    without = {"engine": {"kvCache": {"remote": {"url": "redis://cache:6379/0"}}}}
    assert not any(e["name"] == C.KV_REMOTE_PASSWORD_ENV for e in engine_container(without)["env"])


def test_no_remote_block_renders_no_remote_setting():
    assert "remote_url" not in engine_yaml({})["kv_cache"]
    assert not any(e["name"] == C.KV_REMOTE_PASSWORD_ENV for e in engine_container({})["env"])


# name: (remote block, the message the CEL rule and the operator's check both give)
BAD_REMOTE = {
    "url and managed": ({"url": "redis://x:6379", **MANAGED}, RS.ONE_OF),
    "neither": ({"timeoutMs": 10}, RS.ONE_OF),
    "http url": ({"url": "http://x:6379"}, RS.SCHEME),
    "managed without storage": ({"managed": True}, RS.NEEDS_STORAGE),
    "storage without managed": ({"url": "redis://x:6379", "storage": {"size": "1Gi"}}, RS.MANAGED_ONLY),
    "storage below maxMemory": ({**MANAGED, "storage": {"size": "1Gi"}}, RS.STORAGE_FITS),
    "tiny maxMemory": ({**MANAGED, "maxMemory": "1Mi"}, RS.MAX_MEMORY),
}


@pytest.mark.parametrize("case", sorted(BAD_REMOTE), ids=lambda c: c.replace(" ", "-"))
def test_bad_remote_combinations_are_refused_and_degraded_with_one_message(case):
    remote, message = BAD_REMOTE[case]
    spec = {"engine": {"kvCache": {"remote": remote}}}
    assert any(message in e for e in validate(with_spec(**spec)))
    assert message in problems(with_defaults(spec))


def test_inference_pool_renders_the_pool_and_a_prefix_aware_endpoint_picker():
    out = children(BOTH)
    pool = out[("InferencePool", "chat")]["spec"]
    assert pool["selector"]["matchLabels"] == C.selector_labels("chat")
    assert pool["endpointPickerRef"] == {"name": "chat-epp", "port": {"number": C.EPP_GRPC_PORT},
                                         "failureMode": "FailOpen"}
    config = yaml.safe_load(out[("ConfigMap", "chat-epp-config")]["data"]["config.yaml"])
    assert config["kind"] == "EndpointPickerConfig"
    assert [p["type"] for p in config["plugins"]] == ["single-profile-handler", "prefix-cache-scorer",
                                                      "queue-scorer", "kv-cache-utilization-scorer",
                                                      "max-score-picker"]
    weights = {p["pluginRef"]: p.get("weight") for p in config["schedulingProfiles"][0]["plugins"]}
    assert weights["prefix-cache-scorer"] > weights["queue-scorer"]
    epp = out[("Deployment", "chat-epp")]["spec"]
    args = epp["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == "chat" and args[args.index("--pool-namespace") + 1] == "ns"
    assert epp["template"]["metadata"]["labels"] == picker_selector("chat")
    assert out[("Service", "chat-epp")]["spec"]["ports"][0]["port"] == C.EPP_GRPC_PORT
    assert {r["resources"][0] for r in out[("Role", "chat-epp")]["rules"]} == {
        "pods", "inferencepools", "inferenceobjectives"}
    # estimated scoring reads no events: the engine publishes none
    assert "kv_events" not in engine_yaml(BOTH)


def test_precise_settings_load_in_the_engine(tmp_path):
    spec = {"routing": {"mode": "InferencePool", "inferencePool": {"prefixScoring": "precise"}}}
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_yaml(spec)))
    kv = load_engine_settings(path)[0].kv
    assert kv.kv_events_endpoint == f"tcp://*:{C.KV_EVENTS_PORT}"
    assert (kv.kv_events_hash, kv.kv_events_encoding) == ("vllm_sha256_cbor_64bit", "array")


def test_precise_prefix_scoring_has_every_pod_publish_kv_events_for_llm_ds_picker():
    spec = {**BOTH, "routing": {"mode": "InferencePool", "inferencePool": {"prefixScoring": "precise"}}}
    out = children(spec)
    config = yaml.safe_load(out[("ConfigMap", "chat-epp-config")]["data"]["config.yaml"])
    scorer = next(p for p in config["plugins"] if p["type"] == "precise-prefix-cache-scorer")
    events = scorer["parameters"]["kvEventsConfig"]
    assert events["discoverPods"] and events["podDiscoveryConfig"]["socketPort"] == C.KV_EVENTS_PORT
    assert scorer["parameters"]["tokenProcessorConfig"]["blockSize"] == D.BLOCK_SIZE.value
    events_settings = engine_yaml(spec)["kv_events"]
    assert events_settings["endpoint"] == f"tcp://*:{C.KV_EVENTS_PORT}"
    # the topic llm-d reads the pod and model from; the hashes it recomputes, from the same seed
    assert events_settings["topic"] == f"kv@${{POD_IP}}:{C.ENGINE_PORT}@{C.EMBEDDED_MODEL_NAME}"
    assert events_settings["hash"] == "vllm_sha256_cbor_64bit"
    assert events_settings["hash_seed"] == scorer["parameters"]["tokenProcessorConfig"]["hashSeed"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in \
        engine_container(spec)["env"]
    assert {"name": "kv-events", "containerPort": C.KV_EVENTS_PORT, "protocol": "TCP"} in \
        engine_container(spec)["ports"]
    assert out[("Deployment", "chat-epp")]["spec"]["template"]["spec"]["containers"][0]["image"] == \
        C.EPP_PRECISE_IMAGE


def test_an_existing_picker_is_referenced_not_rendered():
    spec = {"routing": {"mode": "InferencePool", "inferencePool": {"endpointPicker": {"name": "shared-epp"}}}}
    out = children(spec)
    assert out[("InferencePool", "chat")]["spec"]["endpointPickerRef"]["name"] == "shared-epp"
    assert ("Deployment", "chat-epp") not in out


def test_mode_none_renders_a_plain_service_only():
    kinds = {kind for kind, _ in children({"replicas": 3})}
    assert "InferencePool" not in kinds and ("Deployment", "chat-epp") not in children({"replicas": 3})


@pytest.mark.parametrize("mode", ["auto", "ngram", "off"])
def test_speculation_reaches_the_engine(tmp_path, mode):
    assert "speculation" in engine_yaml({})  # kvloop serve's default, rendered for an empty service
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_yaml({"engine": {"speculation": mode}})))
    assert load_engine_settings(path)[0].scheduler.speculation == mode


def test_speculation_outside_its_modes_is_refused():
    assert any("speculation" in e for e in validate(with_spec(engine={"speculation": "eagle"})))


def test_the_remote_settings_load_in_the_engine(tmp_path):
    path = tmp_path / "engine.yaml"
    for spec, url in ((BOTH, f"redis://chat-kv:{C.VALKEY_PORT}/0"), ({}, "")):
        path.write_text(yaml.safe_dump(engine_yaml(spec)))
        assert load_engine_settings(path)[0].kv.kv_remote_url == url


def test_every_pod_exports_what_the_endpoint_picker_scrapes():
    from kvloop.engine.server.metrics import SnapshotCollector
    from kvloop.operator.routing import EPP_SCRAPED_METRICS

    collector = SnapshotCollector(lambda: None, "m", {"block_size": D.BLOCK_SIZE.value, "num_blocks": 100})
    exported = {sample.name for family in collector.collect() for sample in family.samples}
    assert set(EPP_SCRAPED_METRICS) <= exported, set(EPP_SCRAPED_METRICS) - exported
