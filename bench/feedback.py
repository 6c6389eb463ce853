"""Feedback benchmark: W1 (scaled to this CPU) under a load that changes over time, low -> high -> low
twice in one run, with the sidecar's coordinator in `enforce` versus `observe` (observe decides but
never writes, so the engine stays on the start values). Also measures the control block's publish cost.

In-process: one real EngineCore (embedded SmolLM2, bf16 where the CPU has it), the real coordinator
in a thread on the wall clock, a driver loop that submits requests at their arrival times. Writes
bench/results/feedback.json, feedback.md and feedback.png.

    .venv/bin/python bench/feedback.py            # full run (about 5 minutes)
    .venv/bin/python bench/feedback.py --smoke    # seconds; checks that the harness works
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Workload:
    """W1's shape at CPU scale: document QA (Zipf over documents) and multi-turn chat (closed loop)."""

    docs: int = 6
    doc_tokens: int = 256
    question_tokens: int = 24
    answer_tokens: int = 16
    system_tokens: int = 48
    user_tokens: int = 24
    reply_tokens: int = 16
    turns: int = 3
    think_s: float = 1.0
    zipf_s: float = 1.1
    phases: list = field(default_factory=lambda: [("low", 10.0, 0.4), ("high", 10.0, 3.0), ("low", 10.0, 0.4),
                                                  ("high", 10.0, 3.0), ("low", 10.0, 0.4)])
    seed: int = 0


def build_arrivals(w: Workload, vocab: int) -> list[tuple[float, str, list[int], int, dict]]:
    """(time, id, prompt, max_tokens, chat state) for every open-loop arrival: half document questions,
    half first turns of chat sessions (later turns follow replies plus think time)."""
    rng = random.Random(w.seed)
    tok = lambda n: [rng.randrange(100, vocab) for _ in range(n)]  # noqa: E731 (no special tokens)
    docs = [tok(w.doc_tokens) for _ in range(w.docs)]
    weights = [1 / (i + 1) ** w.zipf_s for i in range(w.docs)]
    system = tok(w.system_tokens)
    out, t, n = [], 0.0, 0
    for _, length, rate in w.phases:
        end = t + length
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            n += 1
            if n % 2:
                doc = rng.choices(range(w.docs), weights)[0]
                out.append((t, f"doc-{n}", docs[doc] + tok(w.question_tokens), w.answer_tokens, {}))
            else:
                user = [tok(w.user_tokens) for _ in range(w.turns)]
                out.append((t, f"chat-{n}-0", system + user[0], w.reply_tokens,
                            {"system": system, "user": user, "turn": 0, "history": system + user[0]}))
    return out


def phase_of(w: Workload, t: float) -> int:
    edge = 0.0
    for i, (_, length, _) in enumerate(w.phases):
        edge += length
        if t < edge:
            return i
    return len(w.phases) - 1


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def run_mode(mode: str, make_engine, w: Workload, period_s: float, start_cap: int, start_w: float) -> dict:
    from kvloop.engine.core.sampling import SamplingParams
    from kvloop.sidecar.coordinator import Coordinator
    from kvloop.sidecar.settings import Bounds, SettingsWatcher

    control = f"/dev/shm/kvloop-bench-feedback-{os.getpid()}-{mode}.bin"
    engine = make_engine(control)
    overrides = {"mode": mode, "period_s": period_s, "snapshot_stale_s": 5.0,
                 "batch_cap": Bounds(1, 48, 8, start_cap), "watermark": Bounds(0.0, 0.6, 0.1, start_w)}
    coord = Coordinator(SettingsWatcher(None, overrides), control_path=control)
    stop = threading.Event()
    loop = threading.Thread(target=coord.run, args=(stop,), daemon=True)
    loop.start()

    arrivals = build_arrivals(w, engine.model_config.vocab_size)
    heap = [(a[0], i, a) for i, a in enumerate(arrivals)]
    heapq.heapify(heap)
    seq = len(heap)
    total_s = sum(p[1] for p in w.phases)
    chat_state: dict[str, dict] = {}
    records: dict[str, dict] = {}
    timeline: list[dict] = []
    t0 = time.monotonic()
    next_sample = 0.0
    pre0 = engine.snapshot().num_preemptions
    while True:
        now = time.monotonic() - t0
        while heap and heap[0][0] <= now:
            at, _, (_, rid, prompt, max_tokens, state) = heapq.heappop(heap)
            engine.add_request(rid, prompt,
                               SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
                               arrival_time=t0 + at)
            records[rid] = {"arrival": at, "phase": phase_of(w, at), "tokens": 0}
            if state:
                chat_state[rid] = state
        if engine.has_unfinished():
            for out in engine.step():
                rec = records[out.request_id]
                if out.first_token_time is not None and "ttft" not in rec:
                    rec["ttft"] = out.first_token_time - out.arrival_time
                if out.finished:
                    rec["tokens"], rec["done"] = out.num_output_tokens, time.monotonic() - t0
                    st = chat_state.pop(out.request_id, None)
                    if st and st["turn"] + 1 < w.turns and rec["done"] < total_s:
                        nxt = {**st, "turn": st["turn"] + 1}
                        nxt["history"] = st["history"] + out.token_ids + st["user"][nxt["turn"]]
                        rid = f"{out.request_id.rsplit('-', 1)[0]}-{nxt['turn']}"
                        seq += 1
                        heapq.heappush(heap,
                                       (rec["done"] + random.Random(seq).expovariate(1 / w.think_s), seq,
                                              (0.0, rid, nxt["history"], w.reply_tokens, nxt)))
        elif heap:
            # idle: an empty step publishes the snapshot and polls the targets, as the server's does
            engine.step()
            time.sleep(min(0.01, max(0.0, heap[0][0] - now)))
        else:
            break
        if now >= next_sample:
            snap = engine.snapshot()
            timeline.append({"t": round(now, 2), "phase": phase_of(w, now), "kv_use": snap.kv_usage,
                             "batch_cap": snap.batch_cap, "watermark": snap.watermark,
                             "waiting": snap.num_waiting, "running": snap.num_running})
            next_sample = now + 0.25
    makespan = time.monotonic() - t0
    stop.set()
    loop.join(5)
    snap = engine.snapshot()
    publish = measure_publish(engine)
    engine.control.close()
    os.unlink(control)

    done = [r for r in records.values() if "done" in r]
    ttfts = [r["ttft"] for r in done]
    high = [s["kv_use"] for s in timeline if w.phases[s["phase"]][0] == "high"]
    phases = {}
    for i, (name, _, rate) in enumerate(w.phases):
        rs = [r for r in done if r["phase"] == i]
        tl = [s for s in timeline if s["phase"] == i]
        phases[f"{i}_{name}"] = {
            "rate_req_s": rate, "requests": len(rs), "ttft_p50_s": pct([r["ttft"] for r in rs], 0.5),
            "ttft_p99_s": pct([r["ttft"] for r in rs], 0.99),
            "kv_use_mean": statistics.fmean(s["kv_use"] for s in tl) if tl else None,
            "batch_cap_mean": statistics.fmean(s["batch_cap"] for s in tl) if tl else None,
            "watermark_mean": statistics.fmean(s["watermark"] for s in tl if s["watermark"] is not None)
            if tl and tl[0]["watermark"] is not None else None}
    reasons: dict[str, int] = {}
    for (knob, reason), n in coord.decisions_total.items():
        reasons[f"{knob}:{reason}"] = n
    return {
        "throughput_tok_s": sum(r["tokens"] for r in done) / makespan,
        "ttft_p50_s": pct(ttfts, 0.5), "ttft_p99_s": pct(ttfts, 0.99),
        "preemptions": snap.num_preemptions - pre0,
        "kv_use_high_phase": statistics.fmean(high) if high else None,
        "requests": len(records), "completed": len(done), "makespan_s": makespan,
        "final_batch_cap": snap.batch_cap, "final_watermark": snap.watermark,
        "decisions": reasons, "phases": phases, "timeline": timeline, "publish": publish,
    }


def measure_publish(engine, n: int = 2000) -> dict:
    """Median cost of ControlLink.publish on the engine's real snapshot, and of the whole per-step hook."""
    snap = engine.snapshot()
    link = engine.control.link
    pub, hook = [], []
    for _ in range(n):
        a = time.perf_counter_ns()
        link.publish(snap)
        b = time.perf_counter_ns()
        engine.control.after_step(engine, [])
        c = time.perf_counter_ns()
        pub.append((b - a) / 1e3)
        hook.append((c - b) / 1e3)
    return {"publish_median_us": statistics.median(pub), "publish_p99_us": pct(pub, 0.99),
            "hook_median_us": statistics.median(hook), "hook_p99_us": pct(hook, 0.99), "samples": n}


def plot(results: dict, w: Workload, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for mode, style in (("enforce", "-"), ("observe", "--")):
        tl = results[mode]["timeline"]
        ts = [s["t"] for s in tl]
        axes[0].plot(ts, [s["kv_use"] for s in tl], style, label=mode)
        axes[1].plot(ts, [s["batch_cap"] for s in tl], style, label=mode)
        axes[2].plot(ts, [s["watermark"] or 0 for s in tl], style, label=mode)
    edge = 0.0
    for name, length, _ in w.phases:
        for ax in axes:
            if name == "high":
                ax.axvspan(edge, edge + length, color="0.9")
        edge += length
    for ax, label in zip(axes, ("device KV use", "batch cap", "retention watermark"), strict=True):
        ax.set_ylabel(label)
        ax.legend(loc="upper right")
    axes[2].set_xlabel("seconds (shaded: high-load phases)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(results: dict, w: Workload) -> str:
    e, o = results["enforce"], results["observe"]
    rows = [("throughput (tok/s)", "throughput_tok_s", "{:.1f}"), ("TTFT P50 (s)", "ttft_p50_s", "{:.3f}"),
            ("TTFT P99 (s)", "ttft_p99_s", "{:.3f}"), ("preemptions", "preemptions", "{}"),
            ("mean KV use, high phases", "kv_use_high_phase", "{:.3f}"), ("completed", "completed", "{}"),
            ("final batch cap", "final_batch_cap", "{}"), ("final watermark", "final_watermark", "{}")]
    fmt = lambda f, v: "n/a" if v is None else f.format(v)  # noqa: E731
    lines = ["# Feedback loop: enforce vs observe", "", f"Workload: {json.dumps(results['workload'])}", "",
             "| metric | enforce | observe |", "|---|---|---|"]
    lines += [f"| {name} | {fmt(f, e[k])} | {fmt(f, o[k])} |" for name, k, f in rows]
    lines += ["", "Per phase (enforce / observe): TTFT P99 s, mean KV use, mean batch cap", "",
              "| phase | TTFT P99 | KV use | batch cap |", "|---|---|---|---|"]
    for ph in e["phases"]:
        a, b = e["phases"][ph], o["phases"][ph]
        lines.append(f"| {ph} | {fmt('{:.2f}', a['ttft_p99_s'])} / {fmt('{:.2f}', b['ttft_p99_s'])} "
                     f"| {fmt('{:.2f}', a['kv_use_mean'])} / {fmt('{:.2f}', b['kv_use_mean'])} "
                     f"| {fmt('{:.1f}', a['batch_cap_mean'])} / {fmt('{:.1f}', b['batch_cap_mean'])} |")
    g = results["goals"]
    lines += ["", "Goals: " + ", ".join(f"{k}: {'met' if v else 'missed'}" for k, v in g.items()),
              "", f"Control block publish: median {e['publish']['publish_median_us']:.1f} µs "
              f"(whole per-step hook incl. engine.snapshot(): {e['publish']['hook_median_us']:.1f} µs)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny run: checks the harness, not the numbers")
    p.add_argument("--period", type=float, default=2.0, help="coordinator period (s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a shared machine)")
    p.add_argument("--kv-cache-tokens", type=int, default=2048)
    p.add_argument("--start-cap", type=int, default=4)
    p.add_argument("--start-watermark", type=float, default=0.2)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    import torch

    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.kv.config import KVConfig
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.llama import LlamaModel
    from kvloop.engine.model.locate import embedded_model_path
    from kvloop.engine.scheduler.scheduler import SchedulerConfig
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    w = Workload()
    if args.smoke:
        w = Workload(docs=2, doc_tokens=64, answer_tokens=4, reply_tokens=4, turns=2, think_s=0.2,
                     phases=[("low", 1.0, 1.0), ("high", 1.0, 6.0), ("low", 1.0, 1.0)])
    ckpt = load_checkpoint(embedded_model_path(), progress=False)
    probe = EngineConfig(progress=False)
    from kvloop.engine.engine_core import resolve_dtype

    model = LlamaModel(ckpt.config, ckpt.weights, resolve_dtype(probe.dtype, "cpu"))
    tok = Tokenizer.from_source(ckpt.tokenizer_source)

    def make_engine(control: str) -> EngineCore:
        cfg = EngineConfig(progress=False, kv_cache_tokens=args.kv_cache_tokens, control_file=control,
                           control_stale_after_s=30.0,
                           scheduler=SchedulerConfig(max_num_seqs=args.start_cap, max_num_batched_tokens=512),
                           kv=KVConfig(watermark=args.start_watermark))
        return EngineCore(cfg, model=model, tokenizer=tok, fingerprint=ckpt.fingerprint, model_name=ckpt.name)

    results: dict = {}
    for mode in ("observe", "enforce"):  # observe first: any warm-up cost lands on the baseline
        results[mode] = run_mode(mode, make_engine, w, args.period, args.start_cap, args.start_watermark)
        print(mode, {k: v for k, v in results[mode].items() if k not in ("timeline", "phases", "decisions")})
    e, o = results["enforce"], results["observe"]
    results["workload"] = {"docs": w.docs, "doc_tokens": w.doc_tokens, "answer_tokens": w.answer_tokens,
                           "turns": w.turns, "phases": w.phases, "kv_cache_tokens": args.kv_cache_tokens,
                           "start_batch_cap": args.start_cap, "start_watermark": args.start_watermark,
                           "period_s": args.period, "threads": args.threads, "smoke": args.smoke}
    results["goals"] = {
        "enforce_lowers_ttft_p99": (e["ttft_p99_s"] or 0) < (o["ttft_p99_s"] or 0),
        "throughput_within_5pct": e["throughput_tok_s"] >= 0.95 * o["throughput_tok_s"],
        "kv_use_high_phase_ge_0.85": (e["kv_use_high_phase"] or 0) >= 0.85,
        "publish_median_le_200us": e["publish"]["publish_median_us"] <= 200,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "feedback_smoke" if args.smoke else "feedback"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(markdown(results, w))
    plot(results, w, out / f"{stem}.png")
    print(markdown(results, w))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
