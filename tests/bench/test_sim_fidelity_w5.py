"""bench/sim_fidelity.py --w5: a W5 results file made by the simulator itself (20 s of arrivals) stands in for
the real engine's, so the comparison must find no difference; the goals come from the file's own numbers; the
sizing the real engine ran is the one simulated; missing systems and a changed workload
stop it with a message."""

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SYSTEMS = "continuous+lru,codesign+coord@5s+events"


@pytest.fixture(scope="module")
def bench():
    """bench/'s scripts import each other by name (bench/ is on sys.path when they run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        import sim_fidelity
        import sim_fidelity_w5
        import w5

        yield SimpleNamespace(fidelity=sim_fidelity, w5f=sim_fidelity_w5, w5=w5)


@pytest.fixture(scope="module")
def fake_real(bench, tmp_path_factory) -> Path:
    """A bench/w5.py results file from the simulator: two phases of 10 s at CPU scale."""
    out = tmp_path_factory.mktemp("w5")
    bench.w5.main(["sim", "--scale", "cpu", "--duration", "20", "--phase", "10", "--phase-rates", "1.6,0.8",
                   "--systems", SYSTEMS, "--out", str(out), "--name", "fake_w5"])
    return out / "fake_w5.json"


def fidelity(bench, real: Path, out: Path, *extra: str) -> dict:
    assert bench.fidelity.main(["--w5", str(real), "--out", str(out), *extra]) == 0
    return json.loads((out / "sim_fidelity_w5.json").read_text())


def edited(src: Path, dst: Path, edit) -> Path:
    d = json.loads(src.read_text())
    edit(d)
    dst.write_text(json.dumps(d))
    return dst


def test_the_simulator_matches_itself(bench, fake_real, tmp_path):
    report = fidelity(bench, fake_real, tmp_path)
    assert list(report["systems"]) == SYSTEMS.split(",")
    for name, row in report["systems"].items():
        assert row["real"]["completed"] == row["sim"]["completed"] > 0, name
        assert all(e == pytest.approx(0, abs=1e-9) for e in row["rel_error"].values()), name
        assert set(row["by_kind"]) == {"chat", "rag"}
        assert [p["real"] for p in row["phases"]] == pytest.approx([p["sim"] for p in row["phases"]])
        assert row["sizing_from"] == "recorded in the real run's summary"
    assert all(g["met"] and g["op"] == "<=" and g["bound"] == 0.15 for g in report["goals"])
    assert report["meta"]["workload"]["seed"] == 0 and report["meta"]["real_commands"]
    assert report["meta"]["commands"][0].startswith(".venv/bin/python bench/sim_fidelity.py --w5 ")
    md = (tmp_path / "sim_fidelity_w5.md").read_text()
    assert "codesign+coord@5s+events" in md and "## Goals" in md
    assert (tmp_path / "sim_fidelity_w5.png").exists() == bool(report["plots"])


def test_name_sets_the_files_stem(bench, fake_real, tmp_path):
    """One fidelity file per real file compared: --name keeps them apart (json, md and its plot)."""
    assert bench.fidelity.main(["--w5", str(fake_real), "--out", str(tmp_path), "--systems", "continuous+lru",
                                "--name", "sim_fidelity_w5_load2"]) == 0
    assert not (tmp_path / "sim_fidelity_w5.json").exists()
    report = json.loads((tmp_path / "sim_fidelity_w5_load2.json").read_text())
    assert list(report["systems"]) == ["continuous+lru"] and report["goals"]
    md = (tmp_path / "sim_fidelity_w5_load2.md").read_text()
    assert "sim_fidelity_w5_load2.png" in md or not report["plots"]


def test_goals_come_from_the_numbers_in_the_file(bench, fake_real, tmp_path):
    report = fidelity(bench, fake_real, tmp_path, "--systems", "continuous+lru")
    (g,) = report["goals"]
    row = report["systems"]["continuous+lru"]
    sim, real = row["sim"]["output_throughput_tok_s"], row["real"]["output_throughput_tok_s"]
    assert g["name"] == "continuous+lru: simulated / real output throughput - 1 (abs)"
    assert g["value"] == pytest.approx(abs(sim / real - 1)) and g["values"] == [sim, real]
    table = {n: {"real": {"output_throughput_tok_s": 100.0}, "sim": {"output_throughput_tok_s": s}}
             for n, s in (("over", 120.0), ("under", 90.0), ("none", None))}
    goals = {g["system"]: g for g in bench.w5f.fidelity_goals(table)}
    assert goals["over"]["value"] == pytest.approx(0.2) and not goals["over"]["met"]
    assert goals["under"]["value"] == pytest.approx(0.1) and goals["under"]["met"]
    assert goals["none"]["value"] is None and not goals["none"]["met"]


def test_sizing_computed_as_the_real_engine_when_not_recorded(bench, fake_real, tmp_path):
    info = {"kv_cache_tokens": 12288, "max_num_batched_tokens": 512, "max_num_seqs": 64}

    def old_layout(d):  # real files before the engine recorded its sizing; the coordinator moved the cap
        for name, run in d["systems"].items():
            run.pop("sizing")
            run["info"] = info | ({"max_num_seqs": 9} if "coord" in name else {})

    real = edited(fake_real, tmp_path / "real.json", old_layout)
    report = fidelity(bench, real, tmp_path)
    for row in report["systems"].values():
        assert row["sizing_from"].startswith("not recorded")
        assert row["rel_error"]["output_throughput_tok_s"] == pytest.approx(0, abs=1e-9)
    bad = edited(real, tmp_path / "bad.json", lambda d: d["systems"]["continuous+lru"]["info"].update(
        kv_cache_tokens=24576))
    with pytest.raises(SystemExit, match="kv_cache_tokens"):
        fidelity(bench, bad, tmp_path)


def test_real_engine_sizing_is_the_simulators_at_cpu_scale(bench):
    from kvloop.engine.bench.w5_workload import w5
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.scenarios import sizing_for

    wl = w5("w5", (1.6, 0.8), duration_s=20.0, phase_s=10.0)
    real = asdict(bench.w5.engine_sizing(wl))
    sim = asdict(sizing_for(get_profile("cpu", "/nonexistent"), wl.params["kv_cache_tokens"]))
    assert real.pop("max_context") >= 1500 and {k: v for k, v in sim.items() if k != "max_context"} == real


def test_missing_system_and_changed_workload_stop_with_a_message(bench, fake_real, tmp_path):
    with pytest.raises(SystemExit, match=r"no run of codesign@cap8 \(it has: continuous\+lru, codesign"):
        fidelity(bench, fake_real, tmp_path, "--systems", "continuous+lru,codesign@cap8")
    empty = edited(fake_real, tmp_path / "empty.json", lambda d: d.update(systems={}))
    with pytest.raises(SystemExit, match="no systems"):
        fidelity(bench, empty, tmp_path)
    changed = edited(fake_real, tmp_path / "changed.json", lambda d: d["meta"].update(num_requests=1))
    with pytest.raises(SystemExit, match="num_requests"):
        fidelity(bench, changed, tmp_path)
    assert not (tmp_path / "sim_fidelity_w5.json").exists()


def test_rel_error_and_cells(bench):
    import sim_fidelity_report

    assert bench.fidelity.rel_error(110.0, 100.0) == pytest.approx(0.1)
    assert bench.fidelity.rel_error(None, 100.0) is None and bench.fidelity.rel_error(1.0, 0.0) is None
    assert bench.fidelity.rel_error(float("nan"), 1.0) is None
    assert sim_fidelity_report.pair(100.0, 110.0, "{:.1f}") == "100.0 / 110.0 (+10%)"
    assert sim_fidelity_report.pair(None, 1.0, "{:.1f}") == "— / 1.0"


def test_calibration_notes_say_what_cannot_be_checked(bench):
    real = {"meta": {"machine": {"model": "Xeon", "flags": ["amx_bf16"]}},
            "systems": {"codesign": {"info": {"dtype": "float32"}}}}
    cal = {"exists": True, "machine": "this CPU (2 threads)", "dtype": "bfloat16"}
    notes = bench.w5f.calibration_notes(cal, real)
    assert "cannot be checked" in notes[0] and "Xeon" in notes[0]
    assert notes[1] == "the real engine ran float32, the calibration bfloat16"
    same = {**cal, "machine": {"model": "Xeon", "flags": ["amx_bf16"]}, "dtype": "float32"}
    assert bench.w5f.calibration_notes(same, real) == []
    assert "placeholders" in bench.w5f.calibration_notes({"exists": False}, real)[0]
