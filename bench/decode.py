"""Decode, prefill, concurrent TPOT, peak memory and start-up of kvloop against its peers, in one run.

Systems (`--systems`; default: all below except those marked "on request", each skipped with a note
where it is not installed):
- kvloop (`kvloop serve` with its defaults for this machine), kvloop-fp32 (--dtype float32
  --quantization none: the exact path), kvloop-bf16w (float32 arithmetic on bf16 weights, the CPU
  kernel), kvloop-int8 (weight-only int8); kvloop-int4 and kvloop-dense (--quantization none: with native
  bf16, oneDNN's bf16 GEMM for every step, the default there before the bf16-weight kernel took decode-sized
  steps) on request;
- vllm-cpu-bf16, vllm-cpu-f32 (the latter by default only on CPUs without native bf16): vLLM's CPU
  backend, scripts/install_vllm_cpu.sh;
- llama.cpp-bf16, llama.cpp-q8_0 (llama.cpp-f32 on request): llama-server, scripts/build_llama_server.sh;
- transformers, transformers-fp32: `generate` in a worker process (no server, so no TPOT).

Every server -- kvloop's included -- goes through the same HTTP client (engine/bench/targets/http.py):
single-stream decode = tokens/s between the first and last streamed token of a request, the median of five
requests (fresh prompts, one after another) per start; prefill =
prompt tokens / time to first token of a streamed max_tokens=1 request on a fresh random prompt (a new
one every repetition, so no prompt cache can help); TPOT at 8/16/32 concurrent requests with 2,000-token
contexts (engine/bench/concurrent_tpot.py, as bench/peer_tpot.py; llama.cpp gets -np = concurrency).
Peak memory = the system's process tree, sampled all through its run (start-up included). Start-up =
process start to ready. Each repetition starts every system afresh, one at a time, in an order rotated
per repetition; medians are reported; other processes' load is sampled during every run.

    .venv/bin/python bench/decode.py --reps 3                  # all systems, ~20 min a repetition
    .venv/bin/python bench/decode.py --quick --systems kvloop,llama.cpp-bf16   # smoke test, ~1 min
    .venv/bin/python bench/decode.py --reps 2 --by-machine    # ->
    bench/results/decode_<machine class>/decode.*

Committed results (bench/results/README.md): decode.* (AVX2), decode_avx512bf16/, decode_amx/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    short_prompt: int = 16
    single_tokens: int = 128
    # single streams per start (fresh prompts), median: one 128-token stream swung ±15% here
    single_streams: int = 5
    prefill: int = 2000
    concurrencies: tuple[int, ...] = (8, 16, 32)
    context: int = 2000  # prompt + output of every TPOT request
    tpot_tokens: int = 48
    per_doc: int = 16  # TPOT requests sharing one document (as bench/peer_tpot.py)


QUICK = Sizes(short_prompt=8, single_tokens=16, single_streams=2, prefill=256, concurrencies=(2, 4),
              context=256,
              tpot_tokens=8, per_doc=2)

# kind: how the system runs; tpot: measured at concurrency by default; default: in the default selection
# (True, False = on request, or "no-native-bf16" = only where the CPU lacks native bf16)
SYSTEMS: dict[str, dict] = {
    "kvloop": {"kind": "kvloop", "args": [], "tpot": True},
    "kvloop-fp32": {"kind": "kvloop", "args": ["--dtype", "float32", "--quantization", "none"]},
    "kvloop-bf16w": {"kind": "kvloop", "args": ["--dtype", "float32", "--quantization", "bf16"]},
    "kvloop-int8": {"kind": "kvloop", "args": ["--quantization", "int8"]},
    # dense weights in the model dtype for every step (with native bf16: oneDNN's bf16 GEMM; model/linear.py)
    "kvloop-dense": {"kind": "kvloop", "args": ["--quantization", "none"], "default": False},
    "kvloop-int4": {"kind": "kvloop", "args": ["--quantization", "int4"], "default": False},
    "vllm-cpu-bf16": {"kind": "vllm", "tpot": True},
    "vllm-cpu-f32": {"kind": "vllm", "tpot": True, "default": "no-native-bf16"},
    "llama.cpp-bf16": {"kind": "llama.cpp", "tpot": True},
    "llama.cpp-q8_0": {"kind": "llama.cpp"},
    "llama.cpp-f32": {"kind": "llama.cpp", "default": False},
    "transformers": {"kind": "transformers", "dtype": "bfloat16"},
    "transformers-fp32": {"kind": "transformers", "dtype": "float32"},
}


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


# ---- the transformers worker (runs in a subprocess) -----------------------------------------------
def transformers_worker(dtype: str, threads: int, sizes: Sizes, seed: int) -> dict:
    import torch
    import transformers

    from kvloop.engine.model.locate import embedded_model_path

    torch.set_num_threads(threads)
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=getattr(torch, dtype))
    model.eval()
    loaded_at = time.time()

    def timed(ids: list[int], new: int) -> float:
        x = torch.tensor([ids])
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=2)
            return time.perf_counter() - t

    timed(random_ids(sizes.prefill, seed + 1), 4)  # warm-up, as the servers get
    short = random_ids(sizes.short_prompt, seed + 2)
    # decode only: time for `new` tokens minus time for the first (prefill + one token)
    single = (sizes.single_tokens - 1) / (timed(short, sizes.single_tokens) - timed(short, 1))
    return {"loaded_at": loaded_at, "single_stream_tok_s": single,
            "prefill_tok_s": sizes.prefill / timed(random_ids(sizes.prefill, seed + 3), 1)}


# ---- one system's run ------------------------------------------------------------------------------
def stream_one(target, prompt: list[int], max_tokens: int, tag: str, deadline_s: float = 900) -> dict:
    """One streamed request: time to first token, first-to-last token time, tokens produced."""
    t0 = time.monotonic()
    target.submit(tag, prompt, max_tokens)
    first = last = None
    counted = 0
    deadline = t0 + deadline_s
    while time.monotonic() < deadline:
        for ev in target.poll(1.0):
            if ev.done:
                if ev.error or first is None:
                    raise RuntimeError(f"{tag}: {ev.error or 'no token came back'}")
                return {"ttft_s": first - t0, "decode_s": last - first, "tokens": ev.output_tokens or counted}
            first = ev.t if first is None else first
            last = ev.t
            counted += ev.num_new_tokens
    raise TimeoutError(f"{tag}: unfinished after {deadline_s:.0f} s")


def make_server(name: str, spec: dict, sizes: Sizes, threads: int, kvloop_args: list[str], parallel: int = 1):
    from kvloop.engine.bench.kvloop_serve import KvloopServeTarget
    from kvloop.engine.bench.sizing import Sizing
    from kvloop.engine.bench.systems import make_target

    if spec["kind"] == "kvloop":
        return KvloopServeTarget(name, [*spec["args"], *kvloop_args], threads)
    sizing = Sizing(max_context=max(sizes.prefill + 16, sizes.context) + 64)
    return make_target(f"{name}-np{parallel}" if spec["kind"] == "llama.cpp" else name, sizing, threads)


def run_server(name: str, spec: dict, sizes: Sizes, threads: int, seed: int, tpot: bool,
               kvloop_args: list[str]) -> dict:
    from kvloop.engine.bench.concurrent_tpot import measure_tpot

    out: dict = {}

    def tpot_round(target, c: int, start: bool = False) -> None:
        try:
            if start:
                target.start()
            r = measure_tpot(target, c, sizes.per_doc, seed + c, sizes.context, sizes.tpot_tokens)
        except Exception as e:  # noqa: BLE001 - one concurrency failing (a peer's server dying) keeps the other numbers
            out.setdefault("tpot_errors", {})[str(c)] = f"{type(e).__name__}: {e}"[:500]
            return
        out.setdefault("tpot_ms", {})[str(c)] = round(r["tpot_ms_p50"], 2)
        out.setdefault("tpot_other_cores", {})[str(c)] = round(r["noise"]["other_cores_mean"], 3)

    target = make_server(name, spec, sizes, threads, kvloop_args)
    try:
        t = time.monotonic()
        target.start()
        out["startup_s"] = round(time.monotonic() - t, 2)
        stream_one(target, random_ids(sizes.prefill, seed + 1), 4, f"warm-{seed}")  # first-request costs
        streams = []
        for i in range(sizes.single_streams):
            r = stream_one(target, random_ids(sizes.short_prompt, seed + 100 + i), sizes.single_tokens,
                           f"single-{seed}-{i}")
            streams.append(round((r["tokens"] - 1) / r["decode_s"], 2))
        out["single_stream_tok_s"] = statistics.median(streams)
        out["single_streams_tok_s"] = streams
        try:
            r = stream_one(target, random_ids(sizes.prefill, seed + 3), 1, f"prefill-{seed}")
            out["prefill_tok_s"] = round(sizes.prefill / r["ttft_s"], 2)
        except Exception as e:  # noqa: BLE001 - llama-server sometimes answers it with no token: keep the rest
            out["prefill_error"] = f"{type(e).__name__}: {e}"[:500]
        if tpot and spec["kind"] != "llama.cpp":
            for c in sizes.concurrencies:
                tpot_round(target, c)
    finally:
        target.close()
    if tpot and spec["kind"] == "llama.cpp":  # a server per concurrency: -np = concurrency
        for c in sizes.concurrencies:
            target = make_server(name, spec, sizes, threads, kvloop_args, parallel=c)
            try:
                tpot_round(target, c, start=True)
            finally:
                target.close()
    return out


def run_transformers(spec: dict, sizes: Sizes, threads: int, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "transformers", "--dtype", spec["dtype"], "--threads",
           str(threads),
           "--sizes", json.dumps(dataclasses.asdict(sizes)), "--seed", str(seed)]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if proc.returncode:
        raise RuntimeError(f"transformers worker exited {proc.returncode}: {proc.stderr[-1500:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    return {"startup_s": round(result.pop("loaded_at") - started, 2),
            **{k: round(v, 2) for k, v in result.items()}}


def reap_children(grace_s: float = 15.0) -> list[int]:
    """Waits for this process's leftover descendants (a server's workers) and kills what outlives the grace,
    so they neither load the next system's run nor count in its memory. Returns the pids killed."""
    import psutil

    left = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in alive]


def measure(name: str, sizes: Sizes, threads: int, rep: int, tpot: bool, kvloop_args: list[str]) -> dict:
    """One system, one repetition, under the quiet-machine guard and the memory sampler."""
    from kvloop.engine.bench.guard import NoiseGuard
    from kvloop.engine.bench.process_memory import PeakMemory

    spec = SYSTEMS[name]
    seed = 1000 * (rep + 1)
    with NoiseGuard() as guard, PeakMemory() as memory:
        try:
            if spec["kind"] == "transformers":
                result = run_transformers(spec, sizes, threads, seed)
            else:
                result = run_server(name, spec, sizes, threads, seed, tpot, kvloop_args)
            result.update(memory.as_dict())
        except Exception as e:  # noqa: BLE001 - one system failing must not lose the others' numbers
            result = {"error": f"{type(e).__name__}: {e}"[:2000]}
    killed = reap_children()
    if killed:
        result["killed_leftover_pids"] = killed
    noise = guard.report()
    result["noise"] = {"other_cores_mean": round(noise.other_cores_mean, 3),
                       "other_cores_max": round(noise.other_cores_max, 3), "noisy": noise.noisy}
    return result


# ---- selection, labels ------------------------------------------------------------------------------
def missing(name: str) -> str | None:
    """Why a system cannot run on this machine (None: it can)."""
    from kvloop.engine.bench.systems import missing_reason

    spec = SYSTEMS[name]
    if name == "kvloop-bf16w":
        from kvloop.engine.kernels.cpu import linear_bf16w

        if not linear_bf16w.available():
            return "the bf16-weights CPU kernel is not built (engine/kernels/cpu/build.py)"
    if spec["kind"] == "vllm":
        return missing_reason(name)
    if spec["kind"] == "llama.cpp":
        return missing_reason(f"{name}-np1")
    if spec["kind"] == "transformers":
        return missing_reason("transformers-static")
    return None


def default_systems(native_bf16: bool) -> list[str]:
    def wanted(d) -> bool:
        return d is True or (d == "no-native-bf16" and not native_bf16)

    return [n for n, s in SYSTEMS.items() if wanted(s.get("default", True))]


def kvloop_defaults() -> tuple[str, str]:
    """(dtype, weight format) that `kvloop serve` picks by default on this machine."""
    from kvloop.engine.engine_core import resolve_dtype, resolve_quantization

    return str(resolve_dtype("auto", "cpu")).removeprefix("torch."), resolve_quantization("auto", "auto",
                                                                                          "cpu")


def labels(names: list[str], kvloop_args: list[str]) -> dict[str, str]:
    """What each system computes with, in words (kvloop's defaults resolved for this machine)."""
    dtype, weights = kvloop_defaults()
    default = f"{dtype}, {weights} weights"
    # native bf16: the kernel's bf16 pairs, or the two-graph form
    if dtype == "bfloat16" and weights == "bf16":
        from kvloop.engine.kernels.cpu import amx, linear_bf16w

        rows = linear_bf16w.dense_above_rows()
        pairs = (" (AMX tiles)" if linear_bf16w.tiles() else " (AVX512-BF16 pairs)" if linear_bf16w.native()
                 else "")
        default = (f"bfloat16, bf16-weight kernel{pairs} for every step" if rows is None else
                   f"bfloat16, bf16-weight kernel{pairs} up to {rows} rows, oneDNN over dense weights above"
                   f"{' (AMX tiles)' if amx.available() else ''}")
    out = {"kvloop": f"defaults here: {default}",
           "kvloop-dense": f"{dtype}, dense {dtype} weights for every step",
           "kvloop-fp32": "float32, dense float32 weights (exact path)",
           "kvloop-bf16w": "float32 arithmetic, bf16 weights (CPU kernel)",
           "kvloop-int8": f"{dtype}, weight-only int8 (per channel)",
           "kvloop-int4": f"{dtype}, weight-only int4 (group 32)",
           "vllm-cpu-bf16": "bfloat16, prefix caching on", "vllm-cpu-f32": "float32, prefix caching on",
           "llama.cpp-bf16": "BF16 GGUF, prompt cache on", "llama.cpp-q8_0": "Q8_0 GGUF, prompt cache on",
           "llama.cpp-f32": "F32 GGUF, prompt cache on",
           "transformers": "bfloat16 generate", "transformers-fp32": "float32 generate"}
    extra = f" + {' '.join(kvloop_args)}" if kvloop_args else ""
    return {n: out.get(n, "") + (extra if n.startswith("kvloop") else "") for n in names}


# ---- the driver -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: see above)")
    p.add_argument("--tpot-systems", help="systems measured at concurrency (default: "
                   f"{', '.join(n for n, s in SYSTEMS.items() if s.get('tpot'))})")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, 1 repetition: a smoke test of the harness")
    p.add_argument("--kvloop-args", default="", help="extra `kvloop serve` flags for every kvloop system")
    p.add_argument("--out-dir", type=Path, help="default: bench/results (--quick: a temporary directory)")
    p.add_argument("--by-machine", action="store_true", help="write to bench/results/decode_<machine class>/ "
                   "(amx, avx512bf16, avx2; engine/bench/machine.py machine_class) unless --out-dir is given")
    p.add_argument("--worker", choices=("transformers",), help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if args.worker:
        sizes = Sizes(**{k: tuple(v) if isinstance(v,
                                                   list) else v for k, v in json.loads(args.sizes).items()})
        print("RESULT " + json.dumps(transformers_worker(args.dtype, args.threads, sizes, args.seed)),
              flush=True)
        return 0

    from kvloop.engine.bench import decode_report
    from kvloop.engine.bench.machine import machine_class, machine_info

    machine = machine_info()
    names = args.systems.split(",") if args.systems else default_systems(machine["native_bf16"])
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {list(SYSTEMS)}")
    tpot_names = set(args.tpot_systems.split(",") if args.tpot_systems
                     else [n for n, s in SYSTEMS.items() if s.get("tpot")])
    sizes, reps = (QUICK, 1) if args.quick else (Sizes(), args.reps)
    default_dir = RESULTS / f"decode_{machine_class(machine)}" if args.by_machine else RESULTS
    out_dir = args.out_dir or (Path(tempfile.gettempdir()) / "kvloop-decode-quick" if args.quick
                               else default_dir)
    kvloop_args = args.kvloop_args.split()
    skipped = {n: why for n in names if (why := missing(n))}
    if not args.systems and not kvloop_args and kvloop_defaults() == ("float32", "bf16"):
        skipped.setdefault("kvloop-bf16w", "the same configuration as kvloop's defaults on this machine")
    for n, why in skipped.items():
        print(f"skipping {n}: {why}", flush=True)
    names = [n for n in names if n not in skipped]
    meta = {"machine": machine, "threads": args.threads, "reps": reps, "quick": args.quick,
            "sizes": dataclasses.asdict(sizes), "kvloop_args": kvloop_args,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([".venv/bin/python bench/decode.py",
                                 *(argv if argv is not None else sys.argv[1:])])}
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(reps):  # interleaved: every system once per repetition, the order rotated
        k = rep % max(len(names), 1)
        for name in names[k:] + names[:k]:
            result = measure(name, sizes, args.threads, rep, name in tpot_names, kvloop_args)
            runs[name].append(result)
            print(f"rep {rep} {name}: {json.dumps(result)}", flush=True)
        report = decode_report.build_report(runs, labels(names, kvloop_args), skipped,
                                            {**meta, "reps_done": rep + 1})
        # after every repetition: a stopped run keeps its numbers
        written = decode_report.write(report, out_dir)
    print(decode_report.markdown(report))
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
