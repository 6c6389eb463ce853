"""The engine.yaml key the operator writes for each agreed flag (operator/engine_keys.py) is the `setting`
the engine declares for that flag, so a pod reads what `kvloop serve FLAG` would set. A flag the engine does
not declare yet is skipped by name (helpers add them in turn); the operator renders it only on request."""

from __future__ import annotations

import pytest

from kvloop.engine.config import EngineConfig
from kvloop.engine.core.config_options import config_options
from kvloop.operator.engine_keys import SETTING_KEYS

BY_FLAG = {o.option.flag: o for o in config_options(EngineConfig) if o.option.flag}


@pytest.mark.parametrize("flag", sorted(SETTING_KEYS))
def test_each_key_is_the_engines_setting_for_its_flag(flag):
    if flag not in BY_FLAG:
        pytest.skip(f"kvloop serve has no {flag} yet")
    assert BY_FLAG[flag].option.setting == SETTING_KEYS[flag], flag
