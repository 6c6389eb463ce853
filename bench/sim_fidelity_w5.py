"""The W5 part of sim_fidelity.py (issue 16: the simulator within 15% of the real engine's throughput on W5 at
CPU scale). Reads a real-engine W5 results file (bench/w5.py cpu -> bench/results/w5_cpu.json; nothing is
rerun on the engine), runs each of its systems through the simulator on the same workload (rebuilt from the
file's workload_params and checked against its phase plan and counts) with the real engine's sizing (recorded
in the run's summary, else computed as bench/w5.py's engine_sizing does), and compares
whole-run output throughput
(the goal), TTFT P50/P99 and the per-phase-kind numbers. Writes sim_fidelity_w5.json (top-level `goals`:
|simulated / real - 1| of each system's output throughput <= 0.15), .md and .png.

    .venv/bin/python bench/sim_fidelity.py --w5 [bench/results/w5_cpu.json] [--systems a,b] [--calibration F]
        [--name sim_fidelity_w5_avx2]   # one file per real file compared: bench/results/README.md's names
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, fields
from pathlib import Path

from sim_fidelity import GOAL, rel_error  # bench/ is on sys.path when run as a script
from w5 import PROFILE, WORKLOAD, engine_sizing, run_sim

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.machine import print_goals
from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.w5_variants import parse_variant, sized
from kvloop.engine.bench.w5_workload import W5Params, w5
from kvloop.engine.sim.profiles import CALIBRATION_FILE

ROOT = Path(__file__).resolve().parents[1]
STEM = "sim_fidelity_w5"
WHOLE = ("output_throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "preemptions", "hit_rate_total",
         "kv_use_mean", "completed", "failed")
BY_KIND = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "preemptions")
ERRORS = {"whole": ("output_throughput_tok_s", "ttft_p50_s", "ttft_p99_s"),
          "by_kind": ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s")}
# The real engine's info (engine.info()) names these sizes; the coordinator moves max_num_seqs during a run.
SIZING_INFO = ("kv_cache_tokens", "max_num_batched_tokens", "max_num_seqs")
THROUGHPUT_GOAL = "{}: simulated / real output throughput - 1 (abs)"


def shown(path: str | Path) -> str:
    """A path as the reports name it: relative to the repository where it lies inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


# ---- the real side: workload, systems, sizing ----------------------------------------------------------
def workload_args(meta: dict) -> tuple[tuple[float, float], dict]:
    """(phase rates, w5() overrides) that rebuild the real run's workload from its recorded parameters (all of
    them, so a later change of W5's defaults does not change the workload compared)."""
    names = {f.name for f in fields(W5Params)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["workload_params"].items() if k in names}
    return (kw.pop("chat_rate"), kw.pop("rag_rate")), kw


def check_workload(wl, meta: dict, path: str) -> None:
    """The rebuilt workload is the real run's: its parameters, phase plan and counts as recorded."""
    got = json.loads(json.dumps(wl.params, default=str))  # tuples -> lists, as in the file
    diff = {k: (v, got.get(k)) for k, v in meta["workload_params"].items() if got.get(k) != v}
    if meta.get("phases") is not None and got["phases"] != meta["phases"]:
        diff["phases"] = (meta["phases"], got["phases"])
    counts = {"requests": len(wl.requests), "sessions": len(wl.sessions), "num_requests": wl.num_requests}
    diff.update({k: (meta[k], n) for k, n in counts.items() if k in meta and meta[k] != n})
    if diff:
        raise SystemExit(f"{path}: the W5 workload rebuilt from its meta differs from the real run's "
                         f"(recorded, rebuilt): {diff}; W5's generator changed since that run")


def pick_systems(runs: dict[str, dict], wanted: str | None, path: str) -> list[str]:
    """The systems to compare: all of the real file's, or the comma list asked for (each must be in it)."""
    if not runs:
        raise SystemExit(f"{path}: no systems in the file")
    names = [s for s in (wanted or "").split(",") if s] or list(runs)
    missing = [s for s in names if s not in runs]
    if missing:
        raise SystemExit(f"{path} has no run of {', '.join(missing)} (it has: {', '.join(runs)})")
    for s in names:
        try:
            parse_variant(s)
        except ValueError as e:
            raise SystemExit(f"{path}: {e}") from None
    return names


def run_sizing(run: dict, wl) -> tuple[Sizing, str]:
    """The real run's sizing (the base the variant's cap applies to; sized() again is a no-op) and where it
    came from."""
    if run.get("sizing"):
        return Sizing(**run["sizing"]), "recorded in the real run's summary"
    return engine_sizing(wl), ("not recorded in the real run: bench/w5.py engine_sizing, "
                               "as the real engine ran")


def check_sizing(name: str, sizing: Sizing, info: dict | None) -> None:
    """The sizes the real engine reported (its info) are the ones the simulator gets."""
    v = parse_variant(name)
    run = sized(v, sizing)
    keys = [k for k in SIZING_INFO if k in (info or {}) and not (k == "max_num_seqs" and v.coordinator)]
    bad = {k: (info[k], getattr(run, k)) for k in keys if info[k] != getattr(run, k)}
    if bad:
        raise SystemExit(f"{name}: the real engine ran other sizes than the simulator would get "
                         f"(real, sim): {bad}")


def calibration_info(path: str | None) -> dict:
    """The CPU profile's calibration file and what it was fitted on (placeholders where it is missing)."""
    p = Path(path) if path else CALIBRATION_FILE
    if not p.exists():
        return {"path": shown(p), "exists": False,
                "note": "missing: the CPU profile's placeholder efficiencies"}
    d = json.loads(p.read_text())
    return {"path": shown(p), "exists": True, "machine": d.get("machine"), "threads": d.get("threads"),
            "dtype": d.get("dtype"), "kv_dtype": d.get("kv_dtype"),
            "fit_rms_rel_error": (d.get("fit") or {}).get("rms_rel_error")}


def calibration_notes(cal: dict, real: dict) -> list[str]:
    """Where the calibration may not describe the machine and dtype the real runs had (step costs differ
    severalfold between CPUs with and without native bf16)."""
    if not cal["exists"]:
        return ["no calibration file: the simulator priced steps with the CPU profile's placeholders"]
    machine, out = real["meta"].get("machine"), []
    cm = cal.get("machine")
    if isinstance(cm, dict) and machine:
        if (cm.get("model"), cm.get("flags")) != (machine.get("model"), machine.get("flags")):
            out.append(f"the calibration ran on another machine ({cm.get('model')}) than the real runs "
                       f"({machine.get('model')})")
    else:
        out.append(f"the calibration names its machine only as {cm!r}: that it is the real runs' machine "
                   f"({(machine or {}).get('model', 'not recorded')}) cannot be checked")
    dtypes = {(r.get("info") or {}).get("dtype") for r in real["systems"].values()} - {None}
    if dtypes and dtypes != {cal.get("dtype")}:
        out.append(f"the real engine ran {', '.join(sorted(dtypes))}, the calibration {cal.get('dtype')}")
    return out


# ---- the comparison ------------------------------------------------------------------------------------
def side_by_side(real: dict, sim: dict, keys: tuple[str, ...], errors: tuple[str, ...]) -> dict:
    return {"real": {k: real.get(k) for k in keys}, "sim": {k: sim.get(k) for k in keys},
            "rel_error": {k: rel_error(sim.get(k), real.get(k)) for k in errors}}


def compare_system(real: dict, sim: dict) -> dict:
    """One system's real and simulated numbers: whole run, per phase kind, phase by phase (throughput)."""
    row = side_by_side(real["whole"], sim["whole"], WHOLE, ERRORS["whole"])
    kinds = list(dict.fromkeys([*(real.get("by_kind") or {}), *(sim.get("by_kind") or {})]))
    row["by_kind"] = {k: side_by_side((real.get("by_kind") or {}).get(k, {}),
                                      (sim.get("by_kind") or {}).get(k, {}),
                                      BY_KIND, ERRORS["by_kind"]) for k in kinds}
    sim_phases = sim.get("phases") or []
    row["phases"] = [{"index": p["index"], "kind": p["kind"], "real": p.get("throughput_tok_s"),
                      "sim": sim_phases[i].get("throughput_tok_s") if i < len(sim_phases) else None}
                     for i, p in enumerate(real.get("phases") or [])]
    row["real_noise_other_cores"] = (real.get("noise") or {}).get("other_cores_mean")
    row["sim_cpu_s"] = (sim.get("sim") or {}).get("cpu_s")
    return row


def fidelity_goals(systems: dict[str, dict]) -> list[dict]:
    """Issue 16's goal per system, from the file's own numbers: |simulated / real output throughput - 1|."""
    out = []
    for name, row in systems.items():
        real, sim = row["real"]["output_throughput_tok_s"], row["sim"]["output_throughput_tok_s"]
        err = rel_error(sim, real)
        out.append(goal(THROUGHPUT_GOAL.format(name), abs(err) if err is not None else None, "<=", GOAL,
                        system=name, values=[sim, real]))
    return out


def simulate(real: dict, path: str, systems: str | None, calibration: str | None, jobs: int) -> dict:
    """Every chosen system of the real file through the simulator on its workload and sizing -> the report."""
    meta, scale = real["meta"], real.get("scale", "cpu")
    names = pick_systems(real["systems"], systems, path)
    rates, kw = workload_args(meta)
    wl = w5(WORKLOAD[scale], rates, **kw)
    check_workload(wl, meta, path)
    sizing = {n: run_sizing(real["systems"][n], wl) for n in names}
    for n in names:
        check_sizing(n, sizing[n][0], real["systems"][n].get("info"))
    sims = run_sim(names, scale, rates, kw, PROFILE[scale], calibration, jobs,
                   {n: s for n, (s, _) in sizing.items()})
    table = {n: compare_system(real["systems"][n], sims[n]) | {"sizing": asdict(sizing[n][0]),
                                                               "sizing_from": sizing[n][1]} for n in names}
    return {"systems": table, "goals": fidelity_goals(table), "goal_rel_error": GOAL,
            "sim_runs": {n: {k: v for k, v in r.items() if k != "timeline"} for n, r in sims.items()},
            "profile": PROFILE[scale], "scale": scale}


def report_meta(real: dict, path: str, calibration: str | None, argv: list[str]) -> dict:
    m, cal = real["meta"], calibration_info(calibration)
    return {"title": f"Simulator fidelity on W5 ({'GPU' if real.get('scale') == 'gpu' else 'CPU'} scale)",
            "real_file": shown(path), "real_engine": m.get("engine"), "real_title": m.get("title"),
            "real_started": m.get("started"), "real_machine": m.get("machine"),
            "real_threads": m.get("threads"),
            "real_commands": m.get("commands") or [],
            "workload": {"name": m.get("workload"), "phase_rates": m.get("phase_rates"),
                         "phase_s": m.get("phase_s"),
                         "duration_s": m.get("duration_s"), "seed": m["workload_params"].get("seed"),
                         "num_requests": m.get("num_requests")},
            "calibration": cal,
            "commands": [".venv/bin/python bench/sim_fidelity.py " + shlex.join(argv)],
            "notes": [
                "throughput as bench/w5.py reports it: output tokens / makespan (first send to last finish); "
                "per phase kind: output tokens finished in the kind's windows / the windows",
                "one run per system on each side (the W1 check pools five seeds): the real engine's "
                "run-to-run noise is part of the error",
                "coordinator variants: the coordinator steers the real engine on the wall clock and the "
                "simulator on its virtual clock",
                "the real side is read from the file, not rerun; rerun this after a new calibration",
                *calibration_notes(cal, real)]}


def run_w5(real_path: str, systems: str | None, calibration: str | None, jobs: int, out: str,
           argv: list[str], stem: str | None = None) -> int:
    stem = stem or STEM
    real = json.loads(Path(real_path).read_text())
    report = {"meta": report_meta(real, real_path, calibration, argv),
              **simulate(real, real_path, systems, calibration, jobs)}
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from sim_fidelity_report import write_w5_report

    report["plots"] = write_w5_report(out_dir, report, stem)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_goals(report["goals"], path)
    return 0
