"""Shared-prefix decode: decode step time and decode attention time of the embedded model on the CPU, for
today's path (every row's whole context copied out and padded to the longest), the in-place path and
cascade (shared prefixes read once per group) on the torch backend, and for the C++ CPU kernel (backend
"cpu") plain and with cascade, at batch 8, 16 and 32, context 2,000, with 1 (nothing shared), 4 and 16
rows per shared document. Each cascade path takes the groups its own backend's cost model picks
(cascade_cost.cost_for(kv_dtype, backend)), as the engine does. Without the kernel's build the kernel
paths are skipped, and the result says why.

Block tables are laid out as the KV manager hands them out: a document's blocks once (a prefix-cache
hit for every row after the first), each row's question in consecutive blocks, and its last blocks
interleaved with the other rows' (grown one at a time while decoding). Times are medians over
repetitions of one step (the model's forward and the sampled rows' logits) and of one step's attention
(all layers); other processes' CPU use is sampled throughout, and the CPU flags are recorded.

    .venv/bin/python bench/decode_shared.py [--quick] [--threads 2] [--kv-dtype auto] [--peers peers.json]
    [--stem S] .venv/bin/python bench/decode_shared.py --render-only --peers peers.json   #
    add peer TPOTs afterwards

Committed results (bench/results/README.md): decode_shared.* (AVX2), decode_shared_avx512bf16.*,
decode_shared_amx.*; --by-machine names a new run that way.

Peers (llama.cpp's server with -np = batch, vLLM-CPU) are measured elsewhere; `add_peer_tpots` puts their
TPOT per batch beside ours (peers.json: {"llama.cpp": {"8": 120.0, "16": ...}, "vllm-cpu": {...}}).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from kvloop.engine.config import DTYPES
from kvloop.engine.core.cpu import cpu_flags

RESULTS = Path(__file__).resolve().parent / "results"
TORCH_PATHS = ("today", "inplace", "cascade")
KERNEL_PATHS = ("kernel", "kernel+cascade")
PATHS = TORCH_PATHS + KERNEL_PATHS
OWN_TOKENS = 112  # each row's question plus what it has generated: 7 blocks of 16
GROWN_BLOCKS = 4  # of those, the last ones were allocated while decoding, interleaved with the other rows


def layout(batch: int, ctx: int, per_doc: int, bs: int) -> list[list[int]]:
    """Block tables for `batch` rows of context `ctx`, `per_doc` rows per shared document."""
    n_blocks = -(-ctx // bs)
    shared = (ctx - OWN_TOKENS) // bs if per_doc > 1 else 0
    grown = min(GROWN_BLOCKS, n_blocks - shared)
    nxt = 1  # block 0 stays unused, as a table's padding entry
    tables: list[list[int]] = []
    doc: list[int] = []
    for row in range(batch):
        if row % per_doc == 0 and shared:
            doc, nxt = list(range(nxt, nxt + shared)), nxt + shared
        own = n_blocks - shared - grown
        tables.append(doc + list(range(nxt, nxt + own)))
        nxt += own
    for _ in range(grown):  # decode growth: one block per row in turn
        for table in tables:
            table.append(nxt)
            nxt += 1
    return tables


class Bench:
    def __init__(self, dtype: str, kv_dtype: str, threads: int):
        import torch

        from kvloop.engine.engine_core import resolve_dtype
        from kvloop.engine.model.checkpoint import load_checkpoint
        from kvloop.engine.model.llama import LlamaModel
        from kvloop.engine.model.locate import resolve_model_path
        from kvloop.engine.runner.model_runner import resolve_kv_dtype

        torch.set_num_threads(threads)
        self.torch = torch
        ckpt = load_checkpoint(resolve_model_path(None), progress=False)
        self.dtype = resolve_dtype(dtype, "cpu")
        self.kv_dtype = resolve_kv_dtype(kv_dtype, dtype, self.dtype)
        self.model = LlamaModel(ckpt.config, ckpt.weights, self.dtype, "cpu", "torch")
        self.bs = 16
        self.kernel, self.kernel_note = self._kernel_backend()
        self.paths = PATHS if self.kernel is not None else TORCH_PATHS

    @staticmethod
    def _kernel_backend():
        """The "cpu" backend from the registry, or (None, why not): its paths are skipped then."""
        from kvloop.engine.kernels.backend import available_backends, get_backend
        from kvloop.engine.kernels.cpu import build

        if "cpu" not in available_backends("cpu"):
            return None, ("kernel paths skipped: the CPU attention kernel is not built "
                          f"({build.unavailable_reason()})")
        return get_backend("cpu", "cpu"), None

    def backends(self) -> dict[str, dict]:
        """Per path: the attention backend that ran it, its decode, and whose cost model picked its groups."""
        torch_name = self.model.attention.name
        out = {"today": {"backend": torch_name, "decode": "bench/gathered_decode.py (copy out, pad)",
                         "cascade": None},
               "inplace": {"backend": torch_name, "decode": "torch_decode.decode_attention", "cascade": None},
               "cascade": {"backend": torch_name, "decode": "torch_decode.decode_attention",
                           "cascade": "torch"}}
        if self.kernel is not None:
            from kvloop.engine.kernels.cpu import build

            decode = f"cpu/paged_decode.CpuDecode ({build.simd()})"
            out["kernel"] = {"backend": self.kernel.name, "decode": decode, "cascade": None}
            out["kernel+cascade"] = {"backend": self.kernel.name, "decode": decode,
                                     "cascade": self.kernel.name}
        return out

    def run(self, batch: int, ctx: int, per_doc: int, reps: int) -> dict:
        from gathered_decode import decode_gathered

        from kvloop.engine.cascade.cost import cost_for
        from kvloop.engine.cascade.plan import build_plan
        from kvloop.engine.kernels import torch_decode
        from kvloop.engine.kernels.attention_meta import AttentionMetadata
        from kvloop.engine.kernels.backend import WithDecode

        torch, model, bs = self.torch, self.model, self.bs
        cfg = model.cfg
        tables = layout(batch, ctx, per_doc, bs)
        num_blocks = 1 + max(max(t) for t in tables)
        kv = model.new_kv_cache(num_blocks, bs, self.kv_dtype)
        kv.normal_()  # any finite K/V: the work per step does not depend on the values
        lens = [ctx] * batch
        # each cascade path takes the groups its own backend's measured cost model picks, as
        # the engine's runner does
        plan = build_plan(tables, lens, bs, cost_for(str(self.kv_dtype), "torch").worth)
        kernel_plan = build_plan(tables, lens, bs, cost_for(str(self.kv_dtype), "cpu").worth)
        pos = ctx - 1
        slots = torch.tensor([t[pos // bs] * bs + pos % bs for t in tables])
        ids = torch.randint(100, 40000, (batch,))
        positions = torch.full((batch,), pos)
        q = torch.randn(batch, cfg.num_heads, cfg.head_dim).to(self.dtype)

        def meta(cascade) -> AttentionMetadata:
            return AttentionMetadata(slots, batch, torch.tensor(tables), torch.tensor(lens),
                                     max_decode_context=ctx, cascade=cascade)

        def step(m: AttentionMetadata) -> None:
            model.logits(model.forward(ids, positions, m, kv))

        def attention(m: AttentionMetadata) -> None:
            with torch.inference_mode():
                for layer in range(cfg.num_layers):
                    model.attention.decode(q, kv[layer, 0], kv[layer, 1], m, model.scale)

        def sizes(p) -> list[list[int]]:
            return [] if p is None else [[len(g.rows), g.num_tokens] for g in p.groups]

        out = {"batch": batch, "context": ctx, "rows_per_doc": per_doc, "groups": sizes(plan),
               "kernel_groups": sizes(kernel_plan)}
        saved = model.attention  # the torch backend; the torch paths swap in their decode (WithDecode)
        impls = {"today": (WithDecode("today", decode_gathered, saved), None),
                 "inplace": (WithDecode("inplace", torch_decode.decode_attention, saved), None),
                 "cascade": (WithDecode("cascade", torch_decode.decode_attention, saved), plan)}
        if self.kernel is not None:
            impls |= {"kernel": (self.kernel, None), "kernel+cascade": (self.kernel, kernel_plan)}
        samples = {p: {"step_ms": [], "attention_ms": []} for p in self.paths}
        try:
            for rep in range(reps + 1):  # paths interleaved; the first round warms up and is dropped
                for path in self.paths:
                    model.attention, cascade = impls[path]
                    for name, fn in (("step_ms", step), ("attention_ms", attention)):
                        # a fresh step: the per-step work list is built inside, as in serving
                        m = meta(cascade)
                        t0 = time.perf_counter()
                        fn(m)
                        if rep:
                            samples[path][name].append((time.perf_counter() - t0) * 1e3)
        finally:
            model.attention = saved
        for path in self.paths:
            out[path] = {k: round(statistics.median(v), 2) for k, v in samples[path].items()}
        return out


def _ratio(run: dict, num: str, den: str, key: str) -> float | None:
    """run[num][key] / run[den][key], or None where either path was not measured (the kernel not built)."""
    if num not in run or den not in run:
        return None
    return round(run[num][key] / run[den][key], 3)


def goals(runs: list[dict], skipped: str | None = None) -> list[dict]:
    """Issue 19's goals, computed from the runs. On the torch backend for cascade (named as before, so earlier
    results compare); the same for each kernel path (prefixed with its name); and cascade on the kernel never
    slower than the plain kernel. A kernel path not measured gives value None (`skipped` says why)."""
    from kvloop.engine.bench.goals import goal

    def add(name: str, value: float | None, op: str, bound: float) -> None:
        extra = {} if value is not None else {"note": skipped or "not measured"}
        out.append(goal(name, value, op, bound, **extra))

    out: list[dict] = []
    for r in runs:
        b, g = r["batch"], r["rows_per_doc"]
        for path, label in (("cascade", ""), *((p, f"{p}: ") for p in KERNEL_PATHS)):
            if g >= 16:
                for name, key, target in (("attention", "attention_ms", 4.0), ("step", "step_ms", 2.0)):
                    add(f"{label}batch {b}, {g} rows sharing: {name} speedup over today",
                        _ratio(r, "today", path, key), ">=", target)
            if g == 1:
                add(f"{label}batch {b}, nothing shared: step time / today's",
                    _ratio(r, path, "today", "step_ms"),
                    "<=", 1.05)
        for name, key in (("step", "step_ms"), ("attention", "attention_ms")):
            add(f"batch {b}, {g} rows/doc: kernel+cascade {name} time / kernel's",
                _ratio(r, "kernel+cascade", "kernel", key), "<=", 1.05)
    return out


def add_peer_tpots(result: dict, peer: str, tpot_ms_by_batch: dict) -> None:
    """The hook for peers measured elsewhere: their TPOT (ms) per batch, shown beside our step times."""
    result.setdefault("peers", {})[peer] = {str(b): float(t) for b, t in tpot_ms_by_batch.items()}


def measured_paths(runs: list[dict]) -> list[str]:
    """The paths these runs have numbers for, in PATHS order (no kernel paths where it was not built)."""
    return [p for p in PATHS if all(p in r for r in runs)]


def group_sizes(groups: list[list[int]] | None) -> str:
    """[[4, 1888], [4, 1888]] -> "2 × 4x1888"; "-" for none, "n/a" where not recorded
    (results before the kernel)."""
    if groups is None:
        return "n/a"
    counts = Counter((m, s) for m, s in groups)
    return ", ".join((f"{n} × " if n > 1 else "") + f"{m}x{s}" for (m, s), n in counts.items()) or "-"


def present_flags(flags: list[str] | dict[str, bool]) -> list[str]:
    """The CPU flags a result records: machine.cpu_flags' list, or {flag: present} in
    results saved before it."""
    return [f for f, on in flags.items() if on] if isinstance(flags, dict) else list(flags)


def render_md(result: dict) -> str:
    lines = ["# Shared-prefix decode (bench/decode_shared.py)", "",
             f"CPU: {result['cpu']['model']}; flags: "
             + ", ".join(present_flags(result["cpu"]["flags"]))
             + f"; threads {result['threads']}; model dtype {result['dtype']}, KV {result['kv_dtype']}.",
             f"Other processes' CPU use: mean {result['noise']['other_cores_mean']:.2f} cores, "
             f"max {result['noise']['other_cores_max']:.2f} (noisy: {result['noise']['noisy']})."]
    if result.get("backends") or result.get("kernel_note"):
        lines.append("")
    for path, how in result.get("backends", {}).items():
        by = f"; cascade groups by the {how['cascade']} cost model" if how["cascade"] else ""
        lines.append(f"- {path}: backend {how['backend']}, {how['decode']}{by}")
    if result.get("kernel_note"):
        lines.append(f"- {result['kernel_note']}")
    paths = measured_paths(result["runs"])
    for title, key in (("Decode step", "step_ms"), ("Decode attention (all layers)", "attention_ms")):
        lines += ["", f"## {title}, ms (speedup over today)", "",
                  "| batch | rows/doc | cascade groups, torch / kernel (rows x tokens) | "
                  + " | ".join(paths) + " |",
                  "|---|---|---|" + "---|" * len(paths)]
        for r in result["runs"]:
            groups = " / ".join(group_sizes(r.get(g)) for g in ("groups", "kernel_groups"))
            cells = [f"{r[p][key]}" if p == "today" else f"{r[p][key]} ({r['today'][key] / r[p][key]:.2f}x)"
                     for p in paths]
            lines.append(f"| {r['batch']} | {r['rows_per_doc']} | {groups} | " + " | ".join(cells) + " |")
    lines += ["",
              "Times in ms (medians). A step is the forward pass of all rows plus their logits; attention is"
              " one step's decode attention over all layers.", ""]
    if result.get("peers"):
        lines += ["## Peers (TPOT, ms, same concurrency)", "", "| peer | " + " | ".join(
            f"batch {b}" for b in result["batches"]) + " |", "|---|" + "---|" * len(result["batches"])]
        for peer, tpots in result["peers"].items():
            lines.append(f"| {peer} | "
                         + " | ".join((f"{tpots[str(b)]:.1f}" if str(b) in tpots else "-")
                                      for b in result["batches"]) + " |")
        lines.append("")
    lines += ["## Goals",
              ""] + [f"- [{'x' if g['met'] else ' '}] {g['name']}: {g['value']} ({g['op']} {g['bound']:g})"
                                 + (f" ({g['note']})" if g.get("note") else "") for g in result["goals"]]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    runs = result["runs"]
    labels = [f"b{r['batch']}/g{r['rows_per_doc']}" for r in runs]
    paths = measured_paths(runs)
    width = 0.8 / len(paths)
    for ax, key, title in ((axes[0], "step_ms", "decode step"),
                           (axes[1], "attention_ms", "decode attention")):
        for k, p in enumerate(paths):
            offset = (k - (len(paths) - 1) / 2) * width
            ax.bar([x + offset for x in range(len(runs))], [r[p][key] for r in runs], width, label=p)
        ax.set_xticks(range(len(runs)), labels, rotation=45)
        ax.set_ylabel("ms")
        ax.set_title(f"{title}, context {runs[0]['context']}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, stem: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{stem}.md").write_text(render_md(result))
    plot(result, RESULTS / f"{stem}.png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, a smoke run (written as decode_shared_quick)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-dtype", default="auto", choices=DTYPES,
                   help="KV storage dtype for every path (auto: the engine's choice); not auto: written as "
                   "decode_shared_KV")
    p.add_argument("--peers", default=None, help="JSON {peer: {batch: tpot_ms}} to show beside ours")
    p.add_argument("--render-only", action="store_true", help="re-render the saved result (with --peers)")
    p.add_argument("--stem", default=None,
                   help="results file stem (default: decode_shared[_KV][_quick]), e.g. a "
                   "machine's own: decode_shared_amx")
    p.add_argument("--by-machine", action="store_true",
                   help="default stem decode_shared_<machine class> (amx, "
                   "avx512bf16, avx2: engine/bench/machine.py machine_class)[_KV][_quick]")
    args = p.parse_args()
    base = "decode_shared"
    if args.by_machine:
        from kvloop.engine.bench.machine import machine_class

        base += f"_{machine_class()}"
    stem = args.stem or (base + ("" if args.kv_dtype == "auto" else f"_{args.kv_dtype}")
                         + ("_quick" if args.quick else ""))
    if args.render_only:
        result = json.loads((RESULTS / f"{stem}.json").read_text())
    else:
        from kvloop.engine.bench.guard import NoiseGuard

        # quick: small enough for a smoke run, long enough that both cost models cascade the 8-row group (688
        # shared tokens; the torch path's bf16 entry needs 656 for 8 sharers)
        batches, ctx, per_docs, reps = ((8,), 800, (1, 8), 1) if args.quick else ((8, 16, 32), 2000,
                                                                                  (1, 4, 16),
                                                                                   args.reps)
        bench = Bench(args.dtype, args.kv_dtype, args.threads)
        if bench.kernel_note:
            print(bench.kernel_note)
        with NoiseGuard() as guard:
            runs = [bench.run(b, ctx, min(g, b), reps) for b in batches for g in per_docs]
        result = {"bench": "decode_shared", "quick": args.quick, "threads": args.threads,
                  "dtype": str(bench.dtype).removeprefix("torch."),
                  "kv_dtype": str(bench.kv_dtype).removeprefix("torch."), "cpu": cpu_flags(),
                  "backends": bench.backends(), "kernel_note": bench.kernel_note,
                  "batches": list(batches), "noise": guard.report().as_dict(), "runs": runs}
    result["goals"] = goals(result["runs"], "kernel not built" if result.get("kernel_note") else None)
    if args.peers:
        for peer, tpots in json.loads(Path(args.peers).read_text()).items():
            if not peer.startswith("_") and peer != "goals":  # peer_tpot.py's details and its own goals
                add_peer_tpots(result, peer, tpots)
    write(result, stem)
    print(render_md(result))


if __name__ == "__main__":
    main()
