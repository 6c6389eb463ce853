"""The distribution maps engine/, sidecar/, operator/ to kvloop.* in a built wheel,
never a bare `operator`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_mapped_packages(tmp_path):
    pytest.importorskip("setuptools")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), "-q"], check=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("kvloop-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("kvloop/engine/__init__.py", "kvloop/engine/model/llama.py",
                   "kvloop/engine/scheduler/scheduler.py",
                   "kvloop/sidecar/__init__.py", "kvloop/operator/__init__.py",
                   "kvloop/engine/kernels/cpu/csrc/paged_decode.cpp",
                   "kvloop/engine/kernels/cpu/csrc/simd.h"):
        assert module in names
    assert not any(n.startswith(("operator/", "engine/", "sidecar/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kvloop = kvloop.engine.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_stdlib_operator_is_not_shadowed_from_the_checkout():
    import operator

    # -S: without site, nothing has imported the stdlib `operator` yet, so the checkout's operator/ (first on
    # sys.path, as under `python -m` from the repo root) really is what `import operator` finds first
    code = "import operator; print(operator.__file__, callable(operator.itemgetter))"
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == [operator.__file__, "True"]
