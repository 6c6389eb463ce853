"""The shape every results file's goals share: `met` follows the value, never set by hand."""

import pytest

from kvloop.engine.bench.goals import goal


def test_met_follows_value_and_op():
    assert goal("x", 1.2, ">=", 1.2)["met"] and not goal("x", 1.19, ">=", 1.2)["met"]
    assert goal("y", 0.45, "<=", 0.45)["met"] and not goal("y", 0.46, "<=", 0.45)["met"]
    assert not goal("not run", None, ">=", 1.0, status="not run")["met"]
    assert goal("z", 0, "<=", 0, why="w") == {"name": "z", "value": 0, "op": "<=", "bound": 0, "met": True,
                                              "why": "w"}


def test_unknown_op_is_refused():
    with pytest.raises(ValueError):
        goal("x", 1.0, ">", 0.5)
