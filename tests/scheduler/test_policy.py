"""The policy registry: what each mode means, and every list of modes (CLI choices, settings file, benchmark
sizing, simulator, CRD enum) read from it, so that a new policy is one register call."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import yaml
from sched_helpers import kv_config, make

from kvloop.engine.bench.sizing import Sizing, mode_configs
from kvloop.engine.cli import add_engine_args
from kvloop.engine.config import EngineConfig
from kvloop.engine.core import policy as registry
from kvloop.engine.core.policy import (
    AUTO,
    DEFAULT_POLICY,
    LRU_CACHE,
    Admission,
    Policy,
    cache_policy_names,
    get_policy,
    policy_names,
    register,
    resolve_policy,
)
from kvloop.engine.kv.eviction import EVICTION_ORDERS
from kvloop.engine.scheduler.config import SchedulerConfig
from kvloop.engine.settings_file import SettingsFileError, load_engine_settings
from kvloop.engine.sim.cli import add_simulate_parser
from kvloop.operator.crd import spec_schema

# What each mode meant when it was a string tested in place: (prefix cache, eviction, heat gate, watermark,
# lower tiers, minimum prefix; admission, static batching, cascade scope, feedback loop).
MEANING = {
    "static": (False, "lru", False, False, False, False, Admission.FCFS, True, "nested", False),
    "continuous": (False, "lru", False, False, False, False, Admission.FCFS, False, "nested", False),
    "continuous+lru": (True, "lru", False, False, False, False, Admission.FCFS, False, "common", False),
    "codesign": (True, "gclock", True, True, True, True, Admission.GROUPED, False, "nested", True),
}


def test_the_registry_lists_the_modes_in_benchmark_order():
    assert policy_names() == ("static", "continuous", "continuous+lru", "codesign")
    assert cache_policy_names() == ("continuous", "continuous+lru", "codesign")
    assert DEFAULT_POLICY in policy_names()


@pytest.mark.parametrize("name", policy_names())
def test_each_policy_keeps_the_behaviour_its_mode_had(name):
    p = get_policy(name)
    c = p.cache
    assert (c.prefix_cache, c.eviction, c.heat_gated, c.retention_watermark, c.lower_tiers, c.min_prefix,
            p.admission, p.static_batching, p.cascade_groups, p.feedback_loop) == MEANING[name]
    assert c.eviction in EVICTION_ORDERS


def test_auto_follows_the_kv_managers_cache_policy_and_unknown_names_are_errors():
    assert resolve_policy(AUTO, "continuous+lru").name == "continuous+lru"
    assert resolve_policy("static", "continuous").name == "static"
    with pytest.raises(ValueError, match="codesign"):
        get_policy("nope")
    with pytest.raises(ValueError, match="codesign"):
        SchedulerConfig(mode="nope")
    with pytest.raises(ValueError, match="kv mode"):
        kv_config(mode="static")  # a scheduling policy, not a cache policy
    with pytest.raises(ValueError, match="already registered"):
        register(get_policy("codesign"))


def test_the_scheduler_asks_its_policy():
    grouped = make(kv=kv_config("codesign"), max_num_seqs=2, cascade_cap_factor=2.0)
    assert grouped.policy.groups_prefixes and grouped.row_ceiling == 4 and grouped.static is None
    fcfs = make(kv=kv_config("continuous+lru"), max_num_seqs=2, cascade_cap_factor=2.0)
    assert fcfs.mode == "continuous+lru" and not fcfs.policy.groups_prefixes and fcfs.row_ceiling == 2
    static = make(kv=kv_config("continuous"), mode="static")
    assert static.policy.static_batching and static.static is not None
    assert static.step_cost.groups == "nested" and fcfs.step_cost.groups == "common"


@pytest.fixture
def lru_grouped(monkeypatch):
    """A policy registered for one test: LRU caching under codesign's grouped admission."""
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    return register(Policy("lru+grouped", LRU_CACHE, Admission.GROUPED, static_batching=False,
                           cascade_groups="common", feedback_loop=False))


def _choices(parser: argparse.ArgumentParser, dest: str):
    return next(a for a in parser._actions if a.dest == dest)


def test_a_registered_policy_appears_in_every_list_and_runs(lru_grouped, tmp_path):
    name = lru_grouped.name
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert list(_choices(p, "mode").choices) == list(policy_names()) and name in policy_names()
    sub = argparse.ArgumentParser().add_subparsers()
    add_simulate_parser(sub)
    assert name in _choices(sub.choices["simulate"], "modes").default.split(",")
    engine = spec_schema()["properties"]["engine"]["properties"]
    assert name in engine["scheduler"]["properties"]["mode"]["enum"]

    cfg = EngineConfig(mode=name)
    assert (cfg.scheduler.mode, cfg.kv.mode) == (name, "continuous+lru")
    sched_cfg, kv_cfg = mode_configs(name, Sizing())
    assert sched_cfg.cascade_groups == "common" and kv_cfg.mode == "continuous+lru"
    assert kv_cfg.host_cache_tokens == 0  # no lower tiers in LRU caching
    s = make(kv=kv_config("continuous+lru"), mode=name, max_num_seqs=2)
    assert s.mode == name and s.policy.groups_prefixes and s.row_ceiling == 4

    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"scheduler": {"mode": name}}))
    assert load_engine_settings(path)[0].scheduler.mode == name


def test_the_settings_file_refuses_an_unknown_mode_naming_the_policies(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"scheduler": {"mode": "fastest"}}))
    with pytest.raises(SettingsFileError, match="continuous\\+lru"):
        load_engine_settings(path)


def test_policies_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_policy("codesign").admission = Admission.FCFS  # type: ignore[misc]
