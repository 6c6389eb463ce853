"""How many rows a trace file holds, so that a replay accounts for every one: rows read, rows left out
(and why), rows refused (sim/slo_report.py). The readers (engine/bench/traces.py) skip only blank lines and
rows past their limit."""

from __future__ import annotations

import csv
from pathlib import Path


def count_rows(path: str | Path) -> int:
    """Data rows of an Azure CSV (header excluded) or non-blank lines of a Mooncake JSONL."""
    p = Path(path)
    with open(p, newline="") as f:
        if p.suffix == ".csv":
            return sum(1 for _ in csv.DictReader(f))
        return sum(1 for line in f if line.strip())


def row_account(path: str | Path, read: int, why: str = "limit") -> dict:
    """The trace's rows: in the file, read into the workload, and left out for `why` (the reader's limit, a
    time window)."""
    rows = count_rows(path)
    left_out = {why: rows - read} if rows > read else {}
    return {"file": str(path), "rows": rows, "read": read, "left_out": left_out}
