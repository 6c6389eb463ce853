"""Kernel tests run the Triton kernels under the interpreter (TRITON_INTERPRET=1, set by tests/conftest.py
before triton's import); every test first checks that this really is the case."""

from __future__ import annotations

import pytest

from kvloop.engine.kernels import triton as tk


@pytest.fixture(autouse=True)
def _interpreted() -> None:
    assert tk.is_interpreted(), "TRITON_INTERPRET=1 must be set before triton is imported"


@pytest.fixture
def launches():
    """Call with a kernel name after the run: asserts the Triton kernel (not the torch path) was launched."""
    before = dict(tk.LAUNCHES)

    def check(name: str, times: int = 1) -> None:
        assert tk.LAUNCHES[name] - before.get(name, 0) == times, f"{name} launched {tk.LAUNCHES[name]} times"

    return check
