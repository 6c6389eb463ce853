"""The H200 robustness matrix's traces (issue 57; ../shared/WORKLOADS.md "GPU scale", W5, W3): one cell's
workload from a trace name and an offered rate in requests/s, over a window of arrivals shorter than the
hour the workloads describe, so that the whole matrix runs in minutes on one core.

- W1-gpu: Llama-3.1-8B on the H200 profile; W1 at GPU scale at `rate` requests/s in all (questions and chat
  turns; later turns follow their replies).
- W5-gpu: Llama-3.1-70B-FP8 on the H200 profile; W5's chat and RAG phase rates scaled together so that their
  mean is `rate`, phases shortened to fit the window.
- mooncake: Llama-3.1-8B; the public synthetic Mooncake trace at full length (512 tokens per hash id, the
  model's 131,072-token context), arrivals time-scaled to `rate`, the rows that arrive within the window.
  Rows past the model's context are kept (the scheduler refuses them as too_long) and counted apart."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvloop.engine.bench.workloads import Workload

TRACES = ("W1-gpu", "W5-gpu", "mooncake")
PROFILES = {"W1-gpu": "h200", "W5-gpu": "h200-70b-fp8", "mooncake": "h200"}
# Where continuous+lru's capacity sweep starts (requests/s): near its capacity at the GPU SLO in trial runs,
# so that the sweep brackets it in a few runs.
SWEEP_START = {"W1-gpu": 40.0, "W5-gpu": 1.0, "mooncake": 0.6}
MOONCAKE_PATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "mooncake_synthetic.jsonl"


@dataclass(frozen=True)
class TraceOptions:
    """Windows of arrivals per run (simulated seconds; closed-loop turns and the drain follow). W1-gpu's is
    the shortest: near its capacity it sends ~70 requests/s, more in 90 s than the others in ten minutes."""

    w1_s: float = 90.0
    w5_s: float = 600.0
    w5_phase_s: float = 150.0
    mooncake_s: float = 600.0
    mooncake_path: Path = MOONCAKE_PATH
    seed: int = 0

    def window(self, trace: str) -> float:
        return {"W1-gpu": self.w1_s, "W5-gpu": self.w5_s, "mooncake": self.mooncake_s}[trace]


class MooncakeSource:
    """The trace read once at full length (reading it builds ~60 M prompt tokens, tens of seconds); each cell
    shares its prompts (the simulator copies a prompt when a request arrives) and scales its arrivals."""

    def __init__(self, path: Path, seed: int = 0):
        self.path, self.seed = path, seed
        self._wl: Workload | None = None

    @property
    def base(self) -> Workload:
        if self._wl is None:
            from kvloop.engine.bench.traces import read_mooncake_jsonl

            self._wl = read_mooncake_jsonl(self.path, seed=self.seed)
        return self._wl

    @property
    def rows(self) -> int:
        return len(self.base.requests)

    @property
    def rate(self) -> float:
        """The trace's own rate: rows over the span of their arrivals."""
        reqs = self.base.requests
        return len(reqs) / max(reqs[-1].arrival_s - reqs[0].arrival_s, 1e-9)

    def at(self, rate: float, window_s: float) -> Workload:
        scale = self.rate / rate
        rows = [replace(r, arrival_s=r.arrival_s * scale) for r in self.base.requests
                if r.arrival_s * scale < window_s]
        params = {**self.base.params, "rate": rate, "window_s": window_s, "time_scale": scale,
                  "rows_total": len(self.base.requests)}
        return Workload(f"mooncake@{rate:g}", rows, params=params)


class Traces:
    def __init__(self, opts: TraceOptions):
        self.opts = opts
        self.mooncake = MooncakeSource(opts.mooncake_path, opts.seed)

    def build(self, trace: str, rate: float) -> Workload:
        o = self.opts
        if trace == "W1-gpu":
            from kvloop.engine.sim.scenarios import gpu_w1

            return gpu_w1(rate, o.w1_s, o.seed)
        if trace == "W5-gpu":
            from kvloop.engine.bench.w5_workload import W5_GPU, w5

            f = rate / ((W5_GPU.chat_rate + W5_GPU.rag_rate) / 2)
            return w5("w5-gpu", (W5_GPU.chat_rate * f, W5_GPU.rag_rate * f), duration_s=o.w5_s,
                      phase_s=o.w5_phase_s, seed=o.seed)
        if trace == "mooncake":
            return self.mooncake.at(rate, o.mooncake_s)
        raise ValueError(f"unknown trace {trace!r} ({', '.join(TRACES)})")

    def describe(self, trace: str) -> dict:
        """How the trace's cells are built (for the results file)."""
        o = self.opts
        out = {"profile": PROFILES[trace], "rate_unit": "requests/s offered", "window_s": o.window(trace),
               "seed": o.seed}
        if trace == "W5-gpu":
            out.update(phase_s=o.w5_phase_s, rate_is="mean of the chat and RAG phase rates (ratio as W5_GPU)")
        if trace == "mooncake":
            from kvloop.engine.sim.trace_rows import count_rows

            src = self.mooncake
            out.update(file=str(o.mooncake_path), rows=count_rows(o.mooncake_path), read=src.rows,
                       trace_rate_req_s=src.rate, block_tokens=src.base.params["block_tokens"],
                       rows_in_a_run="those arriving within the window at the run's rate (the rest: each "
                                     "run's rows_left_out_by_window)")
        return out


def rows_left_out(wl: Workload) -> int | None:
    """Rows of a replayed trace that did not arrive within the run's window (None: not a trace replay)."""
    total = wl.params.get("rows_total")
    return None if total is None else total - len(wl.requests)


def rows_beyond(wl: Workload, context: int) -> int:
    """Requests of `wl` longer (prompt + output) than `context`: refusals for length that no simulator
    setting could avoid."""
    return sum(1 for r in wl.requests if len(r.prompt) + r.max_tokens > context)
