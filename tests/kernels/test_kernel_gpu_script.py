"""The prepared GPU check (bench/gpu) in its --dry-run form: CPU, interpreter, tiny shapes. Keeps the
script that only runs on an H200 from rotting between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_dryrun.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    proc = subprocess.run(
        [str(REPO / "bench" / "gpu" / "run_gpu_check.sh"), "--dry-run", "--skip-engine", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["interpreted"] is True
    assert report["summary"]["all_checks_ok"] is True
    assert {c["kernel"] for c in report["checks"]} == {"decode", "extend", "write_kv", "copy_blocks",
                                                       "rms_norm",
                                                         "cascade"}
    for name in ("ceilings", "decode_bandwidth", "decode_sweep", "cascade_timing", "timings"):
        assert "error" not in report[name], report[name]
