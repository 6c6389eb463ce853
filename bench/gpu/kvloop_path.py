"""Make `kvloop.engine` importable from this checkout when the project is not pip-installed (the GPU
machine runs its own python3 with its own torch and triton; only the working tree travels there)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ensure_kvloop() -> str:
    """Returns how kvloop was found: 'installed' or 'shim' (a package alias onto REPO/engine)."""
    try:
        import kvloop.engine  # noqa: F401

        return "installed"
    except ImportError:
        pass
    root = types.ModuleType("kvloop")
    root.__path__ = []  # a namespace with only the subpackage registered below
    sys.modules["kvloop"] = root
    spec = importlib.util.spec_from_file_location(
        "kvloop.engine", REPO / "engine" / "__init__.py", submodule_search_locations=[str(REPO / "engine")]
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["kvloop.engine"] = module
    spec.loader.exec_module(module)
    root.engine = module
    return "shim"
