"""The simulator never imports torch (checked in a fresh interpreter)."""

import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import kvloop.engine.sim as pkg
for m in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module(f"kvloop.engine.sim.{m.name}")
from kvloop.engine.sim.cli import cmd_simulate, build_workload
from kvloop.engine.sim.profiles import get_profile
from kvloop.engine.sim.simulator import Simulator, SimConfig
from kvloop.engine.sim.workload import BenchWorkload
from kvloop.engine.bench import workloads as bw
from kvloop.sidecar.settings import Settings
Simulator(get_profile("h200"), BenchWorkload(bw.w1_smoke()), SimConfig(feedback=Settings(period_s=1.0))).run()
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "triton")
print(bad)
sys.exit(1 if bad else 0)
"""


def test_no_torch_import():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
