"""Settings: the operator's rendered sidecar.yaml parses; bad files are refused; changes reload."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from kvloop.sidecar.settings import (
    Settings,
    SettingsError,
    SettingsWatcher,
    load_settings,
    parse_settings,
    parse_speculation_cap,
)


def test_operator_rendered_config_parses(tmp_path):
    render = pytest.importorskip("kvloop.operator.render")
    from kvloop.operator.spec import with_defaults

    raw = render.sidecar_config("chat", with_defaults({}))
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(raw))
    s = load_settings(path)
    assert s.mode == raw["mode"] and s.period_s == raw["period_s"]
    assert s.batch_cap.max == raw["batch_cap"]["max"]
    assert s.batch_cap.initial is None and s.watermark.initial is None  # the engine's own values
    assert s.ttft_p99_s == raw["targets"]["ttft_p99_s"]
    assert s.max_queue_depth == raw["targets"]["max_queue_depth"]
    assert s.control_path == "/run/kvloop/control.bin" and s.annotation_key == "kvloop.io/feedback"


@pytest.mark.parametrize("raw", [{"mode": "auto"}, {"period_s": 0}, {"batch_cap": {"min": 0}},
                                 {"watermark": {"max": 1.0}}, {"batch_cap": {"min": 8, "max": 4}},
                                 {"law": {"kv_band_low": 0.9, "kv_band_high": 0.8}}, [1, 2],
                                 {"step_token_budget": {"min": 0}},
                                 {"step_token_budget": {"min": 512, "max": 256}},
                                 {"law": {"tpot_headroom": 1.5}}, {"law": {"budget_settle_s": -1}},
                                 {"law": {"preemption_share": -0.1}}, {"law": "learned"},
                                 {"law": {"kind": "pid"}}, {"trial": {"window_periods": 0}},
                                 {"trial": {"margin": 0.9}}, {"trial": {"budget_step": 1.0}},
                                 {"trial": {"windows": 3}}, {"bandit": {"budget_factors": []}},
                                 {"bandit": {"cap_factors": [0.0]}}, {"trial": [1]},
                                 {"speculation_cap": -1}, {"speculation_cap": 65}, {"speculation_cap": 2.5},
                                 {"speculation_cap": "4"}, {"speculation_cap": True}])
def test_bad_settings_refused(raw):
    with pytest.raises(SettingsError):
        parse_settings(raw)


def test_step_token_budget_and_tpot_objective():
    s = parse_settings({"step_token_budget": {"min": 32, "max": 2048, "max_step": 128, "initial": 4096},
                        "targets": {"tpot_p50_s": 0.08},
                        "law": {"event_cooldown_s": 3, "event_preemptions": 5, "budget_settle_s": 60,
                                "preemption_share": 0}})
    assert s.law.budget_settle_s == 60.0 and s.law.preemption_share == 0.0
    assert (s.step_token_budget.min, s.step_token_budget.max, s.step_token_budget.max_step) == (32, 2048, 128)
    assert s.step_token_budget.initial == 2048 and s.tpot_p50_s == 0.08
    assert s.law.event_cooldown_s == 3.0 and s.law.event_preemptions == 5
    d = parse_settings({})
    # no objective: the engine's own budget
    assert d.tpot_p50_s is None and d.step_token_budget.initial is None
    assert d.event_path and not parse_settings({"event_path": False}).event_path


def test_initial_clamped_into_bounds():
    s = parse_settings({"batch_cap": {"min": 4, "max": 8, "initial": 32}})
    assert s.batch_cap.initial == 8


def test_reload_on_change_keeps_old_on_error(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"mode": "observe", "period_s": 5}))
    w = SettingsWatcher(path, overrides={"period_s": 1.0})
    assert w.settings.mode == "observe" and w.settings.period_s == 1.0
    assert not w.poll()
    path.write_text(json.dumps({"mode": "enforce", "period_s": 5}))
    os.utime(path, ns=(1, 10**18))  # a distinct mtime even on coarse clocks
    assert w.poll() and w.settings.mode == "enforce" and w.settings.period_s == 1.0
    path.write_text("{not json")
    os.utime(path, ns=(1, 2 * 10**18))
    assert not w.poll() and w.settings.mode == "enforce" and w.error


def test_configmap_style_symlink_swap(tmp_path):
    """The kubelet updates a ConfigMap volume by swapping a ..data symlink; the watcher sees it."""
    for name, mode in (("v1", "observe"), ("v2", "enforce")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sidecar.yaml").write_text(yaml.safe_dump({"mode": mode}))
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "sidecar.yaml").symlink_to("..data/sidecar.yaml")
    w = SettingsWatcher(tmp_path / "sidecar.yaml")
    assert w.settings.mode == "observe"
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert w.poll() and w.settings.mode == "enforce"


def test_law_choice_and_its_parameters():
    from kvloop.sidecar.settings import BanditParams, TrialParams

    d = parse_settings({})
    assert d.law_kind == "goodput" and d.trial == TrialParams() and d.bandit == BanditParams()  # the default
    assert parse_settings({"law": "goodput"}).law_kind == "goodput"
    s = parse_settings({"law": {"kind": "bandit", "kv_band_low": 0.8},
                        "trial": {"window_periods": 5, "margin": 0.05, "min_judged": 50, "budget_step": 1.5},
                        "bandit": {"budget_factors": [0.5, 1, 2], "explore": 1, "seed": 3}})
    assert s.law_kind == "bandit" and s.law.kv_band_low == 0.8
    t = s.trial
    assert (t.window_periods, t.margin, t.min_judged, t.budget_step) == (5, 0.05, 50, 1.5)
    assert s.trial.settle_periods == TrialParams().settle_periods
    assert s.bandit.budget_factors == (0.5, 1.0, 2.0) and s.bandit.explore == 1.0 and s.bandit.seed == 3
    # kvloop sidecar --law
    assert SettingsWatcher(None, {"law_kind": "rules"}).settings.law_kind == "rules"


def test_speculation_cap_is_no_opinion_unless_set():
    from kvloop.engine.cli import build_parser

    assert Settings().speculation_cap is None and parse_settings({}).speculation_cap is None
    assert parse_settings({"speculation_cap": 0}).speculation_cap == 0
    assert parse_settings({"speculation_cap": 64}).speculation_cap == 64
    # kvloop sidecar --speculation-cap: checked as the file's key (sidecar.main), then an override
    assert build_parser().parse_args(["sidecar", "--speculation-cap", "2"]).speculation_cap == 2
    assert SettingsWatcher(None, {"speculation_cap": parse_speculation_cap(2)}).settings.speculation_cap == 2
    with pytest.raises(SettingsError):
        parse_speculation_cap(65)
