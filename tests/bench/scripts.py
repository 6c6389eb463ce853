"""Loads a script of bench/ by its path (they are scripts, not a package), for tests of their pure halves."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """bench/<name>.py as a module named kvloop_bench_<name>."""
    spec = importlib.util.spec_from_file_location(f"kvloop_bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
