"""A comparison run: systems x request rates x repetitions, interleaved, each run on a fresh target.

Order per repetition: for each rate, every system once, the system order rotated by one each repetition
so no system always runs first (or right after a heavy one). A run flagged noisy by the guard is redone
up to `redo_noisy` times; the quietest attempt is kept and the flag stays in the record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvloop.engine.bench.chains import last_chain
from kvloop.engine.bench.driver import RunResult, run_workload
from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.metrics import SLO, client_metrics, server_metrics
from kvloop.engine.bench.systems import Sizing, make_target, missing_reason
from kvloop.engine.bench.workloads import Workload


@dataclass
class RunRow:
    system: str
    rate: float
    rep: int
    client: dict
    server: dict
    noise: dict
    info: dict
    attempts: int = 1
    ttfts: list[float] = field(default_factory=list)
    last_chain: dict | None = None  # chains.last_chain's, where the workload has chat sessions


@dataclass
class SuiteResult:
    rows: list[RunRow]
    missing: dict[str, str]
    main_rate: float


def _row(res: RunResult, rate: float, rep: int, slo: SLO, attempts: int) -> RunRow:
    ok = [r for r in res.records if r.ok]
    chain = last_chain(res.records)
    return RunRow(res.system, rate, rep, client_metrics(res.records, slo), server_metrics(res.samples),
                  res.noise.as_dict() if res.noise else {}, res.info, attempts, sorted(r.ttft for r in ok),
                  None if chain is None else chain.as_dict())


def run_suite(systems: list[str], make_workload: Callable[[float], Workload], rates: list[float],
              main_rate: float,
              sizing: Sizing, reps: int = 1, slo: SLO | None = None, threads: int | None = None,
              redo_noisy: int = 0, max_other_cores: float = 0.3, timeout_s: float | None = None,
              progress: bool = True, log: Callable[[str], None] = print) -> SuiteResult:
    slo = slo or SLO()
    missing = {s: why for s in systems if (why := missing_reason(s))}
    for s, why in missing.items():
        log(f"skipping {s}: {why}")
    live = [s for s in systems if s not in missing]
    rows: list[RunRow] = []
    for rep in range(reps):
        order = live[rep % len(live):] + live[: rep % len(live)] if live else []
        for rate in rates:
            wl = make_workload(rate)
            for name in order:
                best: RunRow | None = None
                for attempt in range(1 + redo_noisy):
                    target = make_target(name, sizing, threads)
                    try:
                        guard = NoiseGuard(max_other_cores=max_other_cores)
                        res = run_workload(wl, target, progress=progress, timeout_s=timeout_s, guard=guard)
                    finally:
                        target.close()
                    row = _row(res, rate, rep, slo, attempt + 1)
                    if best is None or row.noise.get("other_cores_mean",
                                                     0) < best.noise.get("other_cores_mean", 0):
                        best = row
                    if not row.noise.get("noisy"):
                        break
                best.attempts = attempt + 1
                rows.append(best)
                c = best.client
                log(f"rep {rep} rate {rate:g} {name}: {c['output_throughput_tok_s']:.1f} tok/s, "
                    f"TTFT p99 {c['ttft_p99_s']:.2f} s, TPOT p99 {c['tpot_p99_s'] * 1000:.0f} ms, "
                    f"failed {c['failed']}, other CPU {best.noise.get('other_cores_mean', 0):.2f} cores")
    return SuiteResult(rows, missing, main_rate)
