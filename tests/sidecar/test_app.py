"""The sidecar's HTTP app: /healthz, /metrics (kvloop:feedback_*), /status."""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvloop.engine.control.link import ControlLink
from kvloop.engine.control.records import Targets
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.sidecar.app import build_app
from kvloop.sidecar.coordinator import Coordinator
from kvloop.sidecar.metrics import build_registry
from kvloop.sidecar.settings import SettingsWatcher

NAMES = {"kvloop:feedback_batch_cap", "kvloop:feedback_watermark", "kvloop:feedback_step_token_budget",
         "kvloop:feedback_memory_max_batch_cap", "kvloop:feedback_decision_input",
         "kvloop:feedback_decisions",
         "kvloop:feedback_stale_reads", "kvloop:feedback_last_decision_timestamp_seconds"}


RULES = {"law_kind": "rules"}  # the decisions these tests expect are the rules law's


def test_registry_lists_names_without_a_coordinator():
    assert NAMES <= {m.name for m in build_registry().collect()}


def test_endpoints(tmp_path):
    engine = ControlLink(tmp_path / "c.bin", Targets(8, 0.3))
    coord = Coordinator(SettingsWatcher(None, RULES), control_path=str(tmp_path / "c.bin"))
    engine.publish(EngineSnapshot(num_waiting=0, num_running=1, kv_usage=0.1, batch_cap=8, watermark=0.25,
                                  step_token_budget=512, step_token_budget_max=512))
    coord.sample()
    coord.tick()
    client = TestClient(build_app(coord))
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["ok"] and not health.json()["stale"]
    text = client.get("/metrics").text
    assert "kvloop:feedback_batch_cap 8.0" in text  # no initial in the settings: the engine's own cap
    assert "kvloop:feedback_watermark 0.25" in text
    assert 'kvloop:feedback_decisions_total{knob="watermark",reason="hysteresis"} 1.0' in text
    assert "kvloop:feedback_stale_reads_total 0.0" in text
    assert "kvloop:feedback_last_decision_timestamp_seconds" in text
    assert "kvloop:feedback_step_token_budget 512.0" in text
    assert 'kvloop:feedback_decision_input{input="queue_depth",knob="batch_cap"} 0.0' in text
    assert 'kvloop:feedback_decisions_total{knob="step_token_budget",reason="no_tpot_objective"} 1.0' in text
    status = client.get("/status", params={"limit": 10}).json()
    assert status["mode"] == "enforce" and len(status["decisions"]) == 6
    assert [d["reason"] for d in status["decisions"]][:3] == ["engine_start"] * 3
    assert status["step_token_budget"] == 512 and status["decisions"][3]["inputs"]["kv_use"] == 0.1
    assert status["snapshot"]["num_running"] == 1 and status["snapshot"]["ttft_p99_s"] is None
    dead = TestClient(build_app(coord, alive=lambda: False))
    assert dead.get("/healthz").status_code == 503
