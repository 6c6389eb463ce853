"""The SLO from the InferenceService to the engine: spec.slo's defaults are kvloop serve's
(engine/core/defaults.py), its values reach the engine through the rendered engine.yaml (slo.* keys, the
same settings as --slo-ttft-s, --slo-ttft-per-1k-s and --slo-tpot-s), and a value the engine could not run
with is refused at apply time (the schema) and reported as Degraded for a stored object (spec.problems)."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml
from crdcheck import validate
from test_crd import with_spec

from kvloop.engine.cli import build_parser
from kvloop.engine.core import defaults as D
from kvloop.engine.core.slo import Slo
from kvloop.engine.settings_file import SettingsFileError, load_engine_settings
from kvloop.operator.render import engine_config
from kvloop.operator.spec import SLO_BOUNDS, problems, with_defaults

FLAGS = ("--slo-ttft-s", "--slo-ttft-per-1k-s", "--slo-tpot-s")


def serve_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return out.getvalue()


def test_kvloop_serve_help_lists_the_slo_flags():
    text = serve_help()
    for flag in FLAGS:
        assert flag in text, flag


def test_slo_keys_in_engine_yaml_set_the_engines_slo(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"slo": {"ttft_s": 1.5, "ttft_per_1k_prompt_tokens_s": 0.5,
                                            "tpot_s": 0.1}}))
    config, _ = load_engine_settings(path)
    assert config.scheduler.slo == Slo(1.5, 0.5, 0.1)
    flags = build_parser().parse_args(["serve", "--slo-ttft-s", "1.5", "--slo-ttft-per-1k-s", "0.5",
                                       "--slo-tpot-s", "0.1"])
    assert (flags.slo_ttft_s, flags.slo_ttft_per_1k_s, flags.slo_tpot_s) == (1.5, 0.5, 0.1)


@pytest.mark.parametrize("section", [{"ttft_s": 0}, {"tpot_s": -1}, {"ttft_per_1k_prompt_tokens_s": -0.5},
                                     {"tpot_ms": 100}])
def test_an_slo_the_engine_cannot_judge_by_is_a_settings_error(tmp_path, section):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"slo": section}))
    with pytest.raises(SettingsFileError):
        load_engine_settings(path)


def test_spec_slo_defaults_are_the_engines():
    assert with_defaults({})["slo"] == {"ttftSeconds": D.SLO_TTFT_BASE_S.value,
                                        "ttftPerThousandPromptTokensSeconds": D.SLO_TTFT_PER_1K_S.value,
                                        "tpotSeconds": D.SLO_TPOT_S.value}


def test_spec_slo_reaches_the_engine(tmp_path):
    spec = with_defaults({"slo": {"ttftSeconds": 1.0, "ttftPerThousandPromptTokensSeconds": 0.2,
                                  "tpotSeconds": 0.1}})
    assert problems(spec) == []
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_config("svc", spec)))
    config, _ = load_engine_settings(path)
    assert config.scheduler.slo == Slo(1.0, 0.2, 0.1)


def test_a_partial_spec_slo_keeps_the_other_defaults(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(engine_config("svc", with_defaults({"slo": {"tpotSeconds": 0.1}}))))
    slo = load_engine_settings(path)[0].scheduler.slo
    assert slo == Slo(D.SLO_TTFT_BASE_S.value, D.SLO_TTFT_PER_1K_S.value, 0.1)


INVALID = {
    "ttft of 0": ({"ttftSeconds": 0}, "ttftSeconds"),
    "negative tpot": ({"tpotSeconds": -0.25}, "tpotSeconds"),
    "negative per-token allowance": ({"ttftPerThousandPromptTokensSeconds": -1}, "ttftPerThousandPrompt"),
    "tpot above a minute": ({"tpotSeconds": 61}, "tpotSeconds"),
}


@pytest.mark.parametrize("case", sorted(INVALID), ids=lambda c: c.replace(" ", "-"))
def test_an_invalid_slo_is_refused_at_apply_time_and_reported_by_the_operator(case):
    slo, field = INVALID[case]
    errors = validate(with_spec(slo=slo))
    assert any(field in e for e in errors), errors
    assert any(f"slo.{field}" in p for p in problems(with_defaults({"slo": slo}))), case


def test_the_bounds_admit_the_defaults_and_refuse_what_the_engine_refuses():
    assert validate(with_spec(slo={"ttftPerThousandPromptTokensSeconds": 0})) == []  # a flat TTFT bound
    for key, (lo, _) in SLO_BOUNDS.items():
        assert lo <= with_defaults({})["slo"][key]
    with pytest.raises(ValueError):
        Slo(0.0, 0.0, 0.25)
    with pytest.raises(ValueError):
        Slo(2.0, 0.0, 0.0)
    Slo(SLO_BOUNDS["ttftSeconds"][0], SLO_BOUNDS["ttftPerThousandPromptTokensSeconds"][0],
        SLO_BOUNDS["tpotSeconds"][0])  # the lowest values the schema admits run
