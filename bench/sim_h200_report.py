"""Renders bench/results/sim_h200.json and sim_h200.md (+ plots) from the parts sim_h200.py wrote."""

from __future__ import annotations

import json
from pathlib import Path

from kvloop.engine.bench.goals import goal

ARTICLE = {"throughput_ratio": 2.8, "ttft_p99_static_ms": 420, "ttft_p99_codesign_ms": 185,
           "oom_per_hour_static": 6, "oom_per_hour_codesign": 0, "kv_use_codesign": 0.85}


def _load(results: Path, part: str) -> dict | None:
    """A part's file; parts run in pieces (sim_h200_sweep_a.json, ...) are merged (their runs/rates)."""
    files = sorted(results.glob(f"sim_h200_{part}*.json"))
    if not files:
        return None
    out = json.loads(files[0].read_text())
    for f in files[1:]:
        more = json.loads(f.read_text())
        for key in ("runs", "rates"):
            if isinstance(out.get(key), dict) and isinstance(more.get(key), dict):
                out[key].update(more[key])
    if part == "sweep" and isinstance(out.get("runs"), dict):  # none first, then by period
        out["runs"] = dict(sorted(out["runs"].items(),
                                  key=lambda kv: -1 if kv[0] == "none" else float(kv[0])))
    return out


def _ms(x) -> str:
    return "–" if x is None else f"{1000 * x:.0f}"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def physics(profile_name: str = "h200") -> dict:
    """The numbers that bound what W1 can do on this GPU, from the cost model and the workload shape."""
    from kvloop.engine.sim.profiles import get_profile
    from kvloop.engine.sim.scenarios import gpu_sizing

    prof = get_profile(profile_name)
    m, cm = prof.model, prof.cost_model()
    sizing = gpu_sizing(prof)
    # a full static batch of W1 requests reserves prompt + max tokens each: ~2,050+150 (QA)
    # or up to ~1,070+200 (chat)
    mean_reserve = 0.5 * (2050 + 150) + 0.5 * (100 + 4 * 70 + 3 * 200 / 2 + 200)
    return {
        "kv_pool_tokens": prof.kv_pool_tokens, "weights_gb": m.weight_bytes_per_step / 1e9,
        "decode_step_ms_batch1": 1000 * cm.step_for([(2000, 1, True)]).seconds,
        "prefill_ms_2000": 1000 * cm.step_for([(0, 2000, True)]).seconds,
        "decode_step_ms_batch256_ctx2000": 1000 * cm.step_for([(2000, 1, True)] * 256).seconds,
        "mean_w1_reservation_tokens": mean_reserve,
        "static_batch_for_reservation_oom": int(prof.kv_pool_tokens / mean_reserve),
        "hot_document_kv_share": 200 * 2000 / prof.kv_pool_tokens,
        "max_num_seqs": sizing.max_num_seqs,
        "host_block_us": 1e6 * cm.transfer_seconds(1, 0, prof.block_size),
    }


def write_report(results: Path) -> dict:
    compare, sweep, gate, speed = (_load(results, p) for p in ("compare", "sweep", "gate", "speed"))
    phys = physics()
    report = {"article": ARTICLE, "physics": phys, "compare": compare, "period_sweep": sweep, "gate": gate,
              "speed": speed}
    lines = ["# W1 on a simulated H200 (Llama-3-8B, bf16)", "",
             "Simulated: the real scheduler, KV manager and sidecar control law on a roofline cost model "
             "(engine/sim; H200 4.8 TB/s, 989 TFLOP/s, 141 GB; 80% of bandwidth, 60% of peak, 1 ms per step "
             "assumed, not measured). Pool "
             f"{phys['kv_pool_tokens']:,} tokens of KV (90% of memory minus weights and 2 GB), 256 running "
             "sequences at most, 2,048-token chunked-prefill budget, 128 GiB host tier (codesign). `static` "
             "is the scheduler's static mode: batches of up to 256 formed when 256 wait or the oldest has "
             "waited 0.5 s, no joining mid-batch, prompt + max_tokens reserved up front, a reservation "
             "that does not fit is an out-of-memory event (the request fails).", ""]
    if compare:
        lines += ["## Modes (W1-gpu: Poisson arrivals for the stated seconds, then the drain)", "",
                  "| rate req/s (arrivals s) | mode | out tok/s | req/s | TTFT P50 ms | TTFT P99 ms | failed "
                  "| OOM/h | preempt | KV use mean / max | hit rate | × static |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for rate, row in compare["rates"].items():
            base = row.get("static", {}).get("throughput_tok_s")
            for mode, s in row.items():
                ratio = f"{s['throughput_tok_s'] / base:.2f}" if base else "–"
                lines.append(f"| {rate} ({s.get('duration_s', compare.get('duration_s', 0)):g}) | {mode} | "
                             f"{s['throughput_tok_s']:.0f} | {s['throughput_req_s']:.1f} | "
                             f"{_ms(s['ttft_p50_s'])} | {_ms(s['ttft_p99_s'])} | {s['failed']} | "
                             f"{s['oom_per_hour']:.1f} | {s['preemptions']:.0f} | {_pct(s['kv_use_mean'])} / "
                             f"{_pct(s['kv_use_max'])} | {_pct(s['hit_rate_total'])} | {ratio} |")
        lines += ["", "## Against the article", "", ARTICLE_TEXT.format(**phys, **compare_facts(compare)), ""]
    if sweep:
        lines += [f"## Coordinator period (codesign; load {' / '.join(f'{r:g}' for r in sweep['rates'])} "
                  f"req/s, switching every {sweep['phase_s']:g} s)", "",
                  "| period s | out tok/s | TTFT P50 ms | TTFT P99 ms | E2E P99 s | preempt | cap changes | "
                  "final cap |",
                  "|---|---|---|---|---|---|---|---|"]
        for p, s in sweep["runs"].items():
            caps = [c for c in s.get("changes", []) if c["knob"] == "batch_cap"]
            final = caps[-1]["new"] if caps else ("256 (fixed)" if p == "none" else "32")
            lines.append(f"| {p} | {s['throughput_tok_s']:.0f} | {_ms(s['ttft_p50_s'])} | "
                         f"{_ms(s['ttft_p99_s'])} | {s['e2e_p99_s']:.1f} | {s['preemptions']:.0f} | "
                         f"{len(caps)} | {final} |")
        lines += ["", SWEEP_TEXT.format(**sweep_facts(sweep)), ""]
    if gate:
        lines += ["## Why codesign trails plain LRU past saturation: the device admission gate", "",
                  "| rate req/s (arrivals s) | variant | out tok/s | TTFT P50 ms | TTFT P99 ms | failed | "
                  "prompt tokens from device / host cache | KV use mean |",
                  "|---|---|---|---|---|---|---|---|"]
        for rate, row in gate["rates"].items():
            for name, s in row.items():
                lines.append(f"| {rate} ({gate['duration_s']:g}) | {name} | {s['throughput_tok_s']:.0f} | "
                             f"{_ms(s['ttft_p50_s'])} | {_ms(s['ttft_p99_s'])} | {s['failed']} | "
                             f"{_pct(s['hit_rate_device'])} / {_pct(s['hit_rate_host'])} | "
                             f"{_pct(s['kv_use_mean'])} |")
        lines += ["", GATE_TEXT.format(**gate_facts(gate), block_us=phys["host_block_us"]), ""]
    if speed:
        lines += ["## Speed", "",
                  "One simulated hour of W1-gpu per mode (CPU time of this process; building the "
                  "workload's requests is counted apart; a run of fewer seconds of arrivals is scaled to an "
                  "hour by its virtual seconds, drain included):", "",
                  "| rate req/s | mode | arrivals s | CPU s per simulated hour | building the workload, CPU "
                  "s | steps | virtual s | out tok/s | failed |", "|---|---|---|---|---|---|---|---|---|"]
        speed["runs"] = dict(sorted(speed["runs"].items(), key=lambda kv: kv[1]["rate"]))  # parts ran apart
        for s in speed["runs"].values():
            lines.append(f"| {s['rate']:g} | {s['mode']} | {s.get('sim_seconds', 3600):g} | "
                         f"{s['cpu_s_per_sim_hour']:.0f} | {s['workload_cpu_s']:.0f} | "
                         f"{s['steps']:,} | {s['virtual_s']:.0f} | {s['throughput_tok_s']:.0f} | "
                         f"{s['failed']} |")
        runs = list(speed["runs"].values())
        ok = [f"{r['mode']} at {r['rate']:g}" for r in runs if r["cpu_s_per_sim_hour"] <= 120]
        over = [f"{r['mode']} at {r['rate']:g}" for r in runs if r["cpu_s_per_sim_hour"] > 120]
        lines += ["",
                  f"Within the 2-minute goal: {', '.join(ok) or 'none'}. Over it: "
                  f"{', '.join(over) or 'none'}.",
                  "", SPEED_TEXT, ""]
    report["goals"] = ((compare_goals(compare) if compare else []) + (sweep_goals(sweep) if sweep else [])
                       + (speed_goals(speed, (80.0,)) if speed else []))
    lines += ["## Goals",
              ""] + [f"- [{'x' if g['met'] else ' '}] {g['name']}: {g['value']:.3g} ({g['op']} "
                     f"{g['bound']:g})"
                                 for g in report["goals"]] + [""]
    (results / "sim_h200.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (results / "sim_h200.md").write_text("\n".join(lines) + "\n")
    _plots(results, compare, sweep)
    return report


def compare_facts(compare: dict) -> dict:
    """The numbers ARTICLE_TEXT quotes, from the compare runs (lowest, second-highest, highest rate)."""
    rates = sorted(compare["rates"], key=float)
    lo, mid, hi = rates[0], rates[-2] if len(rates) > 1 else rates[-1], rates[-1]

    def x(rate: str, mode: str) -> float:
        row = compare["rates"][rate]
        return row[mode]["throughput_tok_s"] / row["static"]["throughput_tok_s"]

    st_hi, st_lo = compare["rates"][hi]["static"], compare["rates"][lo]["static"]
    best = max(x(r, m) for r in rates for m in ("codesign", "continuous+lru"))
    return {"lo": lo, "mid": mid, "hi": hi, "x_lo": x(lo, "codesign"), "x_mid": x(mid, "codesign"),
            "x_hi_cd": x(hi, "codesign"), "x_hi_lru": x(hi, "continuous+lru"),
            "static_req_hi": st_hi["throughput_req_s"], "static_p99_hi": st_hi["ttft_p99_s"],
            "static_failed_hi": st_hi["failed"], "static_p99_lo": st_lo["ttft_p99_s"],
            "cd_p99_hi": compare["rates"][hi]["codesign"]["ttft_p99_s"],
            "lru_p99_hi": compare["rates"][hi]["continuous+lru"]["ttft_p99_s"],
            "cd_vs_lru": ("codesign admits past the batch cap while the cascade-priced decode step stays "
                          "within the cap's plain cost (rows joining a shared document add only their "
                          "suffix), so its queue stays short"
                          if compare["rates"][hi]["codesign"]["ttft_p99_s"]
                          <= compare["rates"][hi]["continuous+lru"]["ttft_p99_s"] else
                          "its device admission gate sends chat histories to the host tier although the pool "
                          "has room (see the gate section)"),
            "verdict": ("so about 2.8× is physically possible at H200 scale, but only deep in static's "
                        "overload"
                        if best >= 2.8
                        else f"so the largest ratio reached here is {best:.2f}×, below the article's "
                        "2.8×, and it needs static deep in overload")}


def compare_goals(compare: dict) -> list[dict]:
    """codesign against continuous+lru at every rate of the compare part (the goals of the memory-pressure
    issue for this report): past saturation (the highest rate) throughput >= LRU's, P99 TTFT <= LRU's and no
    more failed requests; at the lower rates no worse (throughput >= 0.99x, P99 TTFT <= 1x)."""
    rates = sorted(compare["rates"], key=float)
    out = []
    for rate in rates:
        cd, lru = compare["rates"][rate]["codesign"], compare["rates"][rate]["continuous+lru"]
        top = rate == rates[-1]
        out.append(goal(f"{rate} req/s: codesign / continuous+lru throughput", cd["throughput_tok_s"]
                        / lru["throughput_tok_s"], ">=", 1.0 if top else 0.99))
        out.append(goal(f"{rate} req/s: codesign / continuous+lru P99 TTFT",
                        cd["ttft_p99_s"] / lru["ttft_p99_s"],
                        "<=", 1.0))
        if top:
            out.append(goal(f"{rate} req/s: codesign failed minus continuous+lru failed",
                            cd["failed"] - lru["failed"],
                            "<=", 0))
    return out


def sweep_goals(sweep: dict) -> list[dict]:
    """The coordinator against codesign's fixed cap ('none') over the period sweep: at its worst period, no
    less throughput (>= 0.99x, as the compare part's ties) and no higher P99 TTFT (issue 16 began from a
    coordinator that lost to the fixed cap at every period)."""
    base = sweep["runs"]["none"]
    runs = [s for p, s in sweep["runs"].items() if p != "none"]
    return [goal("worst period: coordinator / fixed cap throughput",
                 min(s["throughput_tok_s"] for s in runs) / base["throughput_tok_s"], ">=", 0.99),
            goal("worst period: coordinator / fixed cap P99 TTFT",
                 max(s["ttft_p99_s"] for s in runs) / base["ttft_p99_s"], "<=", 1.0)]


def gate_goals(gate: dict) -> list[dict]:
    """codesign with its default device gate against continuous+lru at each rate: no less throughput and no
    higher P99 TTFT (the gate part asks whether the gate is what loses past saturation)."""
    out = []
    for rate, row in gate["rates"].items():
        base, ours = row["continuous+lru"], row["codesign"]
        out += [goal(f"{rate} req/s: codesign / continuous+lru throughput",
                     ours["throughput_tok_s"] / base["throughput_tok_s"], ">=", 1.0),
                goal(f"{rate} req/s: codesign / continuous+lru P99 TTFT",
                     ours["ttft_p99_s"] / base["ttft_p99_s"], "<=", 1.0)]
    return out


def speed_goals(speed: dict, rates: tuple[float, ...] | None = None) -> list[dict]:
    """Issue 16's speed goal per run (of these rates; None: all): one simulated hour of W1-gpu in <= 120 CPU
    seconds (a run of fewer seconds of arrivals is scaled to an hour by its virtual seconds)."""
    return [goal(f"{s['rate']:g} req/s, {s['mode']}: CPU s per simulated hour", s["cpu_s_per_sim_hour"], "<=",
                 120.0)
            for s in speed["runs"].values() if rates is None or s["rate"] in rates]


def gate_facts(gate: dict) -> dict:
    """The numbers GATE_TEXT quotes, at the gate part's highest rate (codesign runs the default gate)."""
    from kvloop.engine.kv.config import KVConfig

    hi = max(gate["rates"], key=float)
    row = gate["rates"][hi]
    cd, g1, lru = row["codesign"], row["codesign, gate 1"], row["continuous+lru"]
    return {"hi": hi, "gate": KVConfig().admit_min_requests, "cd_host": cd["hit_rate_host"],
            "cd_tok": cd["throughput_tok_s"], "cd_p99": cd["ttft_p99_s"],
            "g1_tok": g1["throughput_tok_s"], "g1_p99": g1["ttft_p99_s"], "lru_tok": lru["throughput_tok_s"],
            "lru_p99": lru["ttft_p99_s"], "kv_use": cd["kv_use_mean"]}


GATE_TEXT = """codesign keeps a released block cached on the device only once {gate} distinct requests have
used its hash (`admit_min_requests`); colder blocks go to the host tier. A chat session's history is used by
that session's turns only, so when turn k+1 arrives most of its history has been seen by fewer than
{gate} requests and comes back from the host over PCIe (~{block_us:.0f} µs per 16-token block of Llama-3-8B,
charged serially with compute). At {hi} req/s, {cd_host:.0%} of codesign's prompt tokens come from the
host, its throughput is {cd_tok:.0f} tok/s and its P99 TTFT {cd_p99:.1f} s. With the gate at 1 (every
block kept on the device, as LRU does) codesign serves {g1_tok:.0f} tok/s at a P99 TTFT of {g1_p99:.1f} s,
against plain LRU's {lru_tok:.0f} tok/s and {lru_p99:.1f} s. The device pool is only {kv_use:.0%} used
here, so refusing device residency buys nothing. The gate is meant for a pool under pressure (the CPU
W1 pool holds about ten documents); applied while the pool has room, it costs throughput, and past
saturation every lost percent of throughput becomes queueing. A gate that applies only under pressure
(free and evictable blocks short) would remove the gap; that is a KV-manager policy change, not made
here. (The cost model charges host-to-device copies without overlap with compute; an engine that
overlaps them would narrow the gap but not close it.)"""


ARTICLE_TEXT = """- **Throughput 2.8×**: the ratio depends on the offered load, not only on the system. Below
  static's capacity every mode serves the offered load ({x_lo:.2f}× at {lo} req/s); past it static
  stays at its own capacity while the others keep up, so the ratio grows with the load until they
  saturate too: {x_mid:.2f}× at {mid} req/s offered, {x_hi_cd:.2f}× (codesign) and {x_hi_lru:.2f}×
  (continuous+lru) at {hi} req/s, where static serves ~{static_req_hi:.0f} req/s, waits
  ~{static_p99_hi:.0f} s at P99 and sheds {static_failed_hi} requests at its full queue; {verdict}. It
  comes from the prefix cache (continuous+lru gets it too), not from the coordinator. At {hi} req/s
  codesign's P99 TTFT is {cd_p99_hi:.1f} s against plain LRU's {lru_p99_hi:.1f} s: {cd_vs_lru}.
- **P99 TTFT 420 → 185 ms**: codesign's side is physically possible and then some: with the
  documents and the system prompt cached, a request's prefill is its ~50-token question or last turn,
  and its P99 TTFT stays near 100 ms until saturation (a cold 2,000-token prefill is
  ~{prefill_ms_2000:.0f} ms on this roofline). Static's 420 ms is not possible with W1's output
  lengths: a static batch runs until its longest member has produced 150-200 tokens (about 1 s at
  ~{decode_step_ms_batch1:.0f} ms a step), and a request that arrives meanwhile waits for it, so static's
  P99 TTFT is above a second even at light load ({static_p99_lo:.1f} s at {lo} req/s here) and tens of
  seconds past its capacity.
- **OOM about 6/h → 0**: a static batch runs out of memory only if its up-front reservations
  (prompt + max tokens, ~{mean_w1_reservation_tokens:.0f} tokens per W1 request on average) exceed the
  pool: that takes about {static_batch_for_reservation_oom} W1 requests in one batch, more than twice
  the 256-sequence cap. (Requests that fail in the table are rejections by the bounded waiting queue, 1,024
  deep, under overload, not out-of-memory events.) With W1's lengths on 141 GB an out-of-memory event is
  not physically possible at these batch sizes; codesign and the other continuous modes preempt instead
  and never fail a request.
- **KV use above 85%**: the pool holds {kv_pool_tokens:,} tokens; the 200 hot documents are
  {hot_document_kv_share:.0%} of it and are shared between requests, and 256 sequences of ~2,000 tokens
  would reference ~60% of it even without sharing. KV use above 85% of an H200's pool is not reachable
  with W1 at a 256-sequence cap (see the KV use column); it would take several hundred concurrent
  distinct long contexts."""

SWEEP_TEXT = """The coordinator's settings start the batch cap at 32 (bounds 16-512, raises of at most 64, P99
TTFT objective 0.5 s, the sidecar's other defaults, event path on); 'none' is codesign with a fixed cap of 256
and no coordinator. At the first request the event path places the cap at the memory-derived maximum
(the pool over the observed footprint of a request): {start}, whatever the period. {outcome} Before the
coordinator started there (this sweep as run on 2026-11-29), it started at 32 and only raised, and its
P99 TTFT grew with the period, from 1.5 s at 5 s to 26.7 s at 120 s, against the fixed cap's 66 ms. A
period matters where cuts and raises alternate, which W1 on an H200 does not produce: W5
(bench/results/w5_h200.md) sweeps it under memory pressure."""


def sweep_facts(sweep: dict) -> dict:
    """SWEEP_TEXT's data: where the coordinator's cap started, and whether any period
    differed from the fixed cap."""
    runs = {p: s for p, s in sweep["runs"].items() if p != "none"}
    starts = {(c["t"], c["new"]) for s in runs.values() for c in s.get("changes", [])
              if c["knob"] == "batch_cap" and c["reason"] == "memory_derived_start"}
    start = ", ".join(f"{cap} at t = {t:g} s" for t, cap in sorted(starts)) or "never (no request seen)"
    base = sweep["runs"].get("none")
    kv_max = max(s["kv_use_max"] for s in runs.values()) if runs else 0.0
    pre = sum(s["preemptions"] for s in runs.values())
    keys = ("throughput_tok_s", "ttft_p99_s")
    if base and all(all(s[k] == base[k] for k in keys) for s in runs.values()):
        outcome = (f"The pool is never under pressure (KV use at most {kv_max:.0%}, {pre:.0f} preemptions), "
                   "so that cap never binds and every period serves exactly what the fixed cap serves (same "
                   "throughput, same P99 TTFT): here the period does not matter, and the article's claim "
                   "that 30 s is best has nothing to stand on.")
    else:
        outcome = (f"KV use reaches {kv_max:.0%} and the runs see {pre:.0f} preemptions; the table shows "
                   "what each period costs against the fixed cap.")
    return {"start": start, "outcome": outcome}


SPEED_TEXT = """W1 at GPU scale as WORKLOADS.md sizes it (2,000 four-turn sessions, so 8,000 chat turns, and
as many document questions in the hour: 16,000 requests, 4.44 req/s) is the first rate above; the higher rates
scale the request counts with the rate to reach and pass saturation.

The cost is the real pure-Python scheduler and KV manager, per request and per step. Per request:
hashing its ~130 prompt blocks, looking them up, attaching, committing and releasing them, the
admission gate and prefix view (about 1 ms of CPU per W1 request with a prefix cache, whatever the
rate). Per step that calls schedule(): a visit to every running sequence. Steady decode windows
(everyone decoding, nobody admitted) are replayed without calling schedule(), with exactly the
allocations the scheduler would make, up to and including the step at which sequences sample their
last token (they finish there); when nobody can be admitted anyway (batch cap or token budget
reached, or a static batch running), arrivals join the queue inside the window instead of ending it.
Tests check that results are identical to step-by-step runs. A step that admits a request still goes
through schedule(), so the CPU cost of an hour grows with the requests in it (an hour at 40 req/s is
144,000 requests), and the 2-minute goal holds only up to the rates listed as within it. These are
single runs on a shared VM whose speed drifts: the same 300-second run measured 7.7 s and 12.0 s of
CPU minutes apart, so read each figure as ±30%.

The 80 req/s rows are 600 s of arrivals each (scaled to an hour by their virtual seconds), one mode at a time
on a quiet machine (the speed part's file records which: CPUs differ in Python speed; the same runs took 268
and 800 CPU s on an AMD EPYC, 431 and 1,358 on an older Intel Xeon), with gate-under-pressure codesign, which
serves every request at 80 req/s where plain LRU rejects some. The goal of 120 CPU s per simulated hour is
missed (the goals below). The simulator's block keys come from Python's tuple hash (kv/hashing.py,
TupleChainKeys: blake2b with its memo was a fifth of a continuous+lru run), plan caches key a running row by
one int (its stint), grouped admission peeks a candidate once while the cache stays as it is, and the KV
manager reads its cache policy once: the same runs, bit for bit, at 0.80x the CPU of 550905d's code (600 s of
arrivals at 80 req/s, the two alternating minutes apart: continuous+lru 154 and 148 against 185 and 192 CPU s
per simulated hour, codesign 446 against 557). The machine ran slowly that day: 550905d's code measured 127
(continuous+lru) and 384 (codesign) in the session before. At 80 req/s an hour is ~200,000 steps with ~275
running rows each, so the goal means about 0.6 ms per step: a few microseconds per running row, less than the
per-row bookkeeping of one Python pass. Meeting it takes a step loop that does no per-row work in a step
(decode rows as aggregates, admission from running totals), not a faster version of this one, and a cheaper KV
manager too: in a profile of 300 s of codesign at 80 req/s, its per-request work (allocation with the
evictions and host demotions it brings, prefix lookup, release, the waiting requests' peeks) was about half of
the run, so that half alone would be ~200 CPU s per simulated hour on this machine. Near saturation almost
every step admits a request, so windows are a step or two long and the cost is per step and per request: in a
profile of codesign, grouped admission takes half the time (each step prices the running rows' cascade plan
past the cap, scans every running row's reserve for the gate's headroom, and peeks the prefix cache for each
waiting request), the two cascade-plan updates per step (scheduler and runner) 15%, prefix lookup, block
hashing and allocation of the admitted requests 13%, and writing every lazy row for grouped admission 7%."""


def _plots(results: Path, compare: dict | None, sweep: dict | None) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if compare:
        rates = list(compare["rates"])
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        modes = list(compare["rates"][rates[0]])
        for mode in modes:
            ax[0].plot([float(r) for r in rates],
                       [compare["rates"][r][mode]["throughput_tok_s"] for r in rates],
                       "o-", label=mode)
            ax[1].plot([float(r) for r in rates], [compare["rates"][r][mode]["ttft_p99_s"] for r in rates],
                       "o-", label=mode)
        ax[0].set(xlabel="offered req/s", ylabel="output tok/s", title="throughput")
        ax[1].set(xlabel="offered req/s", ylabel="P99 TTFT (s)", yscale="log", title="P99 TTFT")
        ax[0].legend()
        fig.tight_layout()
        fig.savefig(results / "sim_h200_modes.png", dpi=80)
        plt.close(fig)
    if sweep:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        keys = list(sweep["runs"])
        ax.bar(keys, [sweep["runs"][k]["ttft_p99_s"] for k in keys])
        ax.set(xlabel="coordinator period (s)", ylabel="P99 TTFT (s)", title="period sweep (codesign)")
        fig.tight_layout()
        fig.savefig(results / "sim_h200_period.png", dpi=80)
        plt.close(fig)
