"""bench/results is an index, not a pile: every file there is named in its README.md, the folder holds at most
MAX_FILES files, and every results file's top-level `goals` has the shape the project's goals share."""

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
INDEX = RESULTS / "README.md"
MAX_FILES = 120
OPS = (">=", "<=")


def files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def named(text: str, rel: str) -> bool:
    """rel as a whole path in text: `decode.json` is not named by `decode_amx/decode.json`."""
    return re.search(rf"(?<![\w./-]){re.escape(rel)}(?![\w-]|\.\w)", text) is not None


def test_every_result_file_is_named_in_the_index():
    text = INDEX.read_text()
    missing = [rel for p in files() if p != INDEX and not named(text,
                                                                rel := p.relative_to(RESULTS).as_posix())]
    assert not missing, f"add these to bench/results/README.md (or remove them): {missing}"


def test_the_folder_holds_at_most_max_files():
    count = len(files())
    assert count <= MAX_FILES, (f"bench/results holds {count} files (at most {MAX_FILES}): "
                                "remove superseded runs")


def test_every_result_has_goals_of_the_shared_shape():
    bad = []
    for p in RESULTS.rglob("*.json"):
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or "goals" not in data:
            bad.append(f"{p.name}: no top-level goals list")
            continue
        goals = data["goals"]
        if not isinstance(goals, list):
            bad.append(f"{p.name}: goals is a {type(goals).__name__}, not a list")
            continue
        for g in goals:
            if not isinstance(g, dict) or not {"name", "value", "op", "bound"} <= g.keys():
                bad.append(f"{p.name}: {g!r:.80} lacks name/value/op/bound")
            elif g["op"] not in OPS:
                bad.append(f"{p.name}: {g['name']}: op {g['op']!r} not in {OPS}")
    assert not bad, bad


def test_a_path_inside_another_does_not_count_as_named():
    assert named("see `decode_amx/decode.json`", "decode_amx/decode.json")
    assert not named("see `decode_amx/decode.json`", "decode.json")
    assert not named("see `w5_h200_load1.4.json`", "w5_h200.json")
    assert named("`w5_h200.json`, `w5_h200.md`", "w5_h200.md")
