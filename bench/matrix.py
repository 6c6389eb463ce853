"""The robustness matrix of issue 57: systems x traces x loads, goodput at the SLO per cell.

    .venv/bin/python bench/matrix.py cpu  [options]   live servers on this CPU (engine/bench/matrix_cpu.py)
    .venv/bin/python bench/matrix.py h200 [options]   the H200 simulator (kvloop.engine.sim.matrix)

Results: bench/results/matrix_cpu.{json,md} and its heat maps; matrix_h200.* from the simulator's half."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("cpu", "h200"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[0] == "cpu":
        from kvloop.engine.bench.matrix_cpu import main as run
    else:
        from kvloop.engine.sim.matrix import main as run  # the simulator's half, written beside this one
    return run(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
