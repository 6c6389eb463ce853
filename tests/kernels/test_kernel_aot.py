"""Ahead-of-time compile of every kernel for sm_90 and sm_80 with no GPU: a subprocess without
TRITON_INTERPRET (interpreted kernels cannot be compiled), a fresh Triton cache so nothing is reused,
down to cubin with the ptxas shipped in triton's wheel; fails on errors, shared-memory overflow or spills."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_aot_compile_sm90_sm80(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    # -P and a neutral cwd: the repository root holds an operator/ folder that would shadow the stdlib.
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "kvloop.engine.kernels.triton.aot", "--targets", "90,80", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.stdout.strip(), f"no report; stderr:\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = [r for r in report["results"] if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
    assert proc.returncode == 0
    arches = {r["arch"] for r in report["results"]}
    assert arches == {"sm_90", "sm_80"}
    kernels = {r["kernel"].split("/")[0] for r in report["results"]}
    assert kernels == {"write_kv", "decode", "decode_merge", "extend", "copy_blocks", "rms_norm",
                       "cascade_shared"}
    for r in report["results"]:
        assert {"ttgir", "llir", "ptx", "cubin"} <= set(r["stages"]), r
