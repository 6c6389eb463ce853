"""bench/decode_shared.py's pure half: the issue's goals per path and the tables, from
made-up runs (no model)."""

from .scripts import load_script


def load_bench():
    return load_script("decode_shared")


def times(step: float, attention: float) -> dict:
    return {"step_ms": step, "attention_ms": attention}


def run(per_doc: int, kernel: bool = True) -> dict:
    r = {"batch": 16, "context": 2000, "rows_per_doc": per_doc, "groups": [[16, 1888]] if per_doc > 1 else [],
         "kernel_groups": [[16, 1888]] if per_doc > 1 else [],
         "today": times(200.0, 100.0), "inplace": times(190.0, 90.0), "cascade": times(90.0, 20.0)}
    if kernel:
        r |= {"kernel": times(80.0, 30.0), "kernel+cascade": times(82.0, 20.0)}
    return r


def result(runs: list[dict]) -> dict:
    return {"cpu": {"model": "cpu", "flags": {"avx2": True}}, "threads": 2, "dtype": "bfloat16",
            "kv_dtype": "bfloat16",
            "noise": {"other_cores_mean": 0.0, "other_cores_max": 0.0, "noisy": False},
            "batches": [16], "runs": runs}


def test_goals_per_path_keep_the_torch_names_and_add_the_kernel_ones():
    ds = load_bench()
    goals = {g["name"]: g for g in ds.goals([run(16), run(1)])}
    # the torch path's goals are named as before, so earlier results compare
    assert goals["batch 16, 16 rows sharing: attention speedup over today"]["value"] == 5.0
    assert goals["batch 16, 16 rows sharing: step speedup over today"]["met"]
    assert goals["batch 16, nothing shared: step time / today's"]["value"] == 0.45
    assert goals["kernel+cascade: batch 16, 16 rows sharing: attention speedup over today"]["value"] == 5.0
    assert not goals["kernel: batch 16, 16 rows sharing: attention speedup over today"]["met"]  # 3.33x
    assert goals["kernel: batch 16, nothing shared: step time / today's"]["value"] == 0.4
    assert goals["batch 16, 16 rows/doc: kernel+cascade step time / kernel's"]["met"]  # 1.025: within 5%
    assert goals["batch 16, 1 rows/doc: kernel+cascade attention time / kernel's"]["value"] == 0.667


def test_skipped_kernel_gives_unmet_goals_with_the_reason_and_tables_without_its_columns():
    ds = load_bench()
    runs = [run(16, kernel=False)]
    goals = {g["name"]: g for g in ds.goals(runs, "kernel not built")}
    missing = goals["kernel: batch 16, 16 rows sharing: step speedup over today"]
    assert missing["value"] is None and not missing["met"] and missing["note"] == "kernel not built"
    assert goals["batch 16, 16 rows sharing: step speedup over today"]["met"]
    res = result(runs) | {"goals": list(goals.values())}
    md = ds.render_md(res)
    assert "| today | inplace | cascade |\n" in md and "kernel+cascade |" not in md


def test_tables_show_every_measured_path_with_its_speedup():
    ds = load_bench()
    runs = [run(16)]
    md = ds.render_md(result(runs) | {"goals": ds.goals(runs)})
    assert ("| 16 | 16 | 16x1888 / 16x1888 | 200.0 | 190.0 (1.05x) | 90.0 (2.22x) | 80.0 (2.50x) "
            "| 82.0 (2.44x) |") in md
    assert ("| 16 | 16 | 16x1888 / 16x1888 | 100.0 | 90.0 (1.11x) | 20.0 (5.00x) | 30.0 (3.33x) "
            "| 20.0 (5.00x) |") in md
    assert ds.group_sizes([[4, 1888], [4, 1888], [16, 64]]) == "2 × 4x1888, 16x64"
    assert ds.group_sizes([]) == "-" and ds.group_sizes(None) == "n/a"
