"""Measures the decode-attention step-cost model (engine/cascade/cost.py) on this CPU, per attention backend.

--backend torch: times one attention call (torch_decode.span_attention, the call plain rows and cascade groups
both make) for stacked rows M and tokens S over a grid, and the log-sum-exp merge per row, then fits
    t(M, S) = call_us + row_us * M + S * max(token_us, token_row_us * M)
per KV dtype: a robust line in S per M (intercept, slope); the intercepts give call_us and row_us, the
slope at M = 1 gives token_us, the slopes per row of stacks of 8 and more give token_row_us.

--backend cpu: the C++ kernel (kernels/cpu/paged_decode.attend) takes a whole step in one call, so a "call" of
the model is one segment of it. Over the same grid it times the stacked call (one segment: M rows against S
shared tokens, in place over the paged cache) and the plain call (M one-row segments over those tokens), and
the merge of a group's partial results with its rows' own parts, which the kernel does inside the call
(paged_decode.decode): that call's time less the same segments' without the merge (paged_decode.attend, the
partial results as they are), and fits
    t(M, S) = call_us + row_us * M + S * max(token_us, token_stack_us + token_row_us * M)
(the kernel widens each K/V tile once for all its stacked rows): the stacked intercepts give row_us, the
plain ones the call's fixed cost (the same with or without cascade: left out of the model) and call_us per
segment, the plain slopes per row token_us, the stacked slopes of 2 rows and more a line in M
(token_stack_us, token_row_us), the merge's line group_us and merge_us. A group's segment timed alone
priced stacked rows about 2x above whole decodes here, so the terms only cascade uses (token_stack_us,
token_row_us, group_us, merge_us) are then refitted on whole decodes with and without the group (MARGIN
points), and the margin fitted on the same decodes. It then checks the model's decision
(worth) against the measured faster path, the kernel's whole decode with and without the group
(cpu.paged_decode.CpuDecode, merges included), on held-out (members, shared tokens) points, each row with
its own 112 tokens after the shared ones. Where the kernel is built with its blocked bf16 routine
(AVX512-BF16), the cpu backend prices bf16 K/V under its own cost name, "cpu/avx512bf16": only bf16 is
measured, into cascade_calibration_cpu_avx512bf16.json, for the _CPU_BF16_BLOCKED entry (fp32 K/V run the
other routine there). Where the CPU also has AMX tiles, a group's stacked rows take the tile routine, under
the cost name "cpu/amx":
bf16 only, with bf16 queries (the tile routine's, and the engine's model's there), into
cascade_calibration_cpu_amx.json, for the _CPU_BF16_AMX entry.

Prints the entries to paste into cascade/cost.py, the fit's worst relative error and the break-even shared
length per group size, and writes them as JSON with top-level goals.

    python bench/calibrate_cascade.py [--backend torch|cpu] [--quick] [--threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from kvloop.engine.bench.goals import goal
from kvloop.engine.cascade.cost import AMX_TILES, AttentionCost
from kvloop.engine.kernels import torch_decode

BLOCK, N_KV, HEADS, HD = 16, 3, 9, 64  # the embedded model's attention shape


def best_us(fn, reps: int) -> float:
    """Minimum over reps: the least disturbed run (other processes only ever add time)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def measure(dtype: torch.dtype, rows_grid: list[int], tokens_grid: list[int], reps: int) -> list[tuple]:
    blocks = max(tokens_grid) // BLOCK + 1
    k = torch.randn(blocks, BLOCK, N_KV, HD).to(dtype)
    v = torch.randn(blocks, BLOCK, N_KV, HD).to(dtype)
    samples = []
    for m in rows_grid:
        q = torch.randn(m, HEADS, HD).to(dtype)
        for s in tokens_grid:
            runs = [(0, -(-s // BLOCK), s)]
            samples.append((m, s, best_us(lambda q=q, runs=runs: torch_decode.span_attention(
                q, k, v, runs, HD ** -0.5), reps)))
    return samples


def copy_crossover(dtype: torch.dtype, tokens_grid: list[int], reps: int, batch: int = 16) -> int:
    """The longest own part for which copying rows out and batching them beats reading each in place."""
    blocks = max(tokens_grid) // BLOCK + 1
    k = torch.randn(batch * blocks + 1, BLOCK, N_KV, HD).to(dtype)
    v = torch.randn_like(k)
    q = torch.randn(batch, HEADS, HD).to(dtype)
    best = 0
    starts = [1 + b * blocks for b in range(batch)]
    for s in sorted(tokens_grid):
        nb = -(-s // BLOCK)
        short = torch_decode.bucket_short_rows([(b, list(range(st, st + nb)),
                                                 s) for b, st in enumerate(starts)],
                                               "cpu")[0]
        copied = best_us(lambda short=short: torch_decode.gathered_attention(q, k, v, short, HD ** -0.5,
                                                                             False), reps)
        in_place = best_us(lambda nb=nb, s=s: [torch_decode.span_attention(
            q[b:b + 1], k, v, [(st, nb, s)], HD ** -0.5, False) for b, st in enumerate(starts)], reps)
        if copied < in_place:
            best = s
    return best


def measure_merge(rows: int, reps: int) -> float:
    acc = torch.randn(rows * 2, HEADS, HD)
    acc_lse = torch.randn(rows * 2, HEADS)
    idx = torch.arange(0, rows * 2, 2)
    out, lse = torch.randn(rows, HEADS, HD), torch.randn(rows, HEADS)
    return best_us(lambda: torch_decode.merge_into(acc, acc_lse, idx, out, lse), reps) / rows


def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope, robust to one disturbed sample: the median of the pairwise slopes (Theil-Sen)."""
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
                    if xs[j] != xs[i])
    slope = slopes[len(slopes) // 2] if slopes else 0.0
    intercepts = sorted(y - slope * x for x, y in zip(xs, ys, strict=True))
    return intercepts[len(intercepts) // 2], slope


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def lines_per_rows(samples: list[tuple]) -> dict[int, tuple[float, float]]:
    """(intercept, slope) of time against tokens, per number of stacked rows, of (M, S, us) samples."""
    per_rows = {}
    for m in sorted({m for m, _, _ in samples}):
        pts = [(s, us) for mm, s, us in samples if mm == m]
        per_rows[m] = line([s for s, _ in pts], [us for _, us in pts])
    return per_rows


def fit(samples: list[tuple], merge_us: float) -> tuple[AttentionCost, float]:
    per_rows = lines_per_rows(samples)
    rows = sorted(per_rows)
    call_us, row_us = line([float(m) for m in rows], [per_rows[m][0] for m in rows])
    token_us = max(per_rows[rows[0]][1], 0.0) / rows[0]
    big = [per_rows[m][1] / m for m in rows if m >= 8] or [per_rows[rows[-1]][1] / rows[-1]]
    token_row_us = median(big)  # stacks of 8 and more are bound by the products
    cost = AttentionCost(round(max(call_us, 0.0), 3), round(max(row_us, 0.0), 4), round(token_us, 5),
                         round(max(token_row_us, 0.0), 6), merge_us=round(merge_us, 3))
    worst = max(abs(cost.span_us(m, s) - us) / us for m, s, us in samples)
    return cost, worst


def break_even(cost: AttentionCost, members: int) -> int | None:
    for tokens in range(BLOCK, 65536, BLOCK):
        if cost.worth(members, tokens):
            return tokens
    return None


def calibration_goals(result: dict) -> list[dict]:
    """bf16's break-even at 16 sharers against the published 256-512 shared tokens (issue 19), and each fit's
    worst sample within 50% (the acceptance used here: a coarser model would gate cascade wrongly)."""
    out = []
    bf16 = result["dtypes"].get("bfloat16")
    if bf16:
        by_sharers = bf16["break_even_tokens"]
        even = by_sharers["16"] if "16" in by_sharers else by_sharers[16]
        out += [goal("bf16 break-even shared tokens at 16 sharers (published >= 256)", even, ">=", 256),
                goal("bf16 break-even shared tokens at 16 sharers (published <= 512)", even, "<=", 512)]
    out += [goal(f"{name}: fit worst relative error", d["fit_worst_relative_error"], "<=", 0.5)
            for name, d in result["dtypes"].items()]
    return out


# --- the CPU kernel (--backend cpu) ---

# each row's own tokens after the shared ones in the held-out check (as bench/decode_shared.py)
OWN_TOKENS = 112
TIE = 0.05  # plain and cascade within 5% of each other: either choice is right
HELD_OUT = [(m, s) for m in (2, 3, 4, 6, 12, 16, 24) for s in (48, 192, 400, 800, 1888)]
HELD_OUT_QUICK = [(2, 1888), (4, 1888), (16, 1888), (3, 400), (8, 96), (16, 48)]
# Where the margin is fitted: whole decodes apart from the held-out ones (other group sizes and lengths)
MARGIN = [(m, s) for m in (2, 5, 8, 16) for s in (96, 272, 608, 1248)]
MARGIN_QUICK = [(2, 272), (8, 96)]
CPU_NAMES = {"bfloat16": "_CPU_BF16", "float32": "_CPU_FP32"}  # the cpu entries' names in cascade/cost.py
# the blocked bf16 routine's ("cpu/avx512bf16"): bf16 K/V only
BLOCKED_NAMES = {"bfloat16": "_CPU_BF16_BLOCKED"}
AMX_NAMES = {"bfloat16": "_CPU_BF16_AMX"}  # ... with the AMX tile routine for stacked rows ("cpu/amx")


def entry_names(cost_name: str) -> dict[str, str]:
    """KV dtype -> the cascade/cost.py entry a cpu calibration under this cost name measures: with the blocked
    bf16 routine built, bf16 K/V take it (its own entry); other dtypes run the routine
    measured on CPUs without it."""
    return {"cpu": CPU_NAMES, f"cpu/{AMX_TILES}": AMX_NAMES}.get(cost_name, BLOCKED_NAMES)


def query_dtype(cost_name: str, kv_dtype: torch.dtype) -> torch.dtype:
    """The queries' dtype in the measurements: fp32 (the CPU model's), except under "cpu/amx", where the
    engine's model computes in bf16 (--dtype auto on a CPU with native bf16) and the tile routine takes only
    bf16 queries over bf16 K/V: fp32 queries there would time the other routines."""
    return kv_dtype if cost_name == f"cpu/{AMX_TILES}" else torch.float32


def cpu_cost_name() -> str:
    """The cost name the cpu backend prices the measured shape's decodes under on this CPU
    (CpuBackend.cost_name, bf16 queries: on a CPU with AMX tiles, the tile routine's name; query_dtype then
    keeps the queries bf16)."""
    from kvloop.engine.kernels.backend import get_backend
    from kvloop.engine.kernels.cpu import build

    if not build.load():
        raise SystemExit(f"the CPU kernel is not built: {build.unavailable_reason()}")
    return get_backend("cpu", "cpu").cost_name(HD, torch.bfloat16, BLOCK)


def best_of_each(fns: list, reps: int) -> list[float]:
    """best_us of each, in rounds that run every one once: each one's repetitions spread over the whole
    measurement, so that a stretch disturbed by other processes does not take all of them. Each timed run
    follows an untimed one of the same call (as every layer's call follows the previous layer's): a small
    call right after a large one measured up to 2x slower."""
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            fn()
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return [b * 1e6 for b in best]


def paged_cache(dtype: torch.dtype, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(blocks, BLOCK, N_KV, HD).to(dtype)
    return k, torch.randn_like(k)


def measure_cpu(dtype: torch.dtype, rows_grid: list[int], tokens_grid: list[int], reps: int,
                q_dtype: torch.dtype = torch.float32) -> tuple[list, list]:
    """(M, S, us) of the kernel's stacked call (one segment of M rows) and of its plain call (M one-row
    segments), over the same S tokens of the paged cache (block 0 unused, as in the engine); queries in
    q_dtype (query_dtype)."""
    from kvloop.engine.kernels.cpu.paged_decode import attend, pack_segments

    k, v = paged_cache(dtype, max(tokens_grid) // BLOCK + 2)
    q = torch.randn(max(rows_grid), HEADS, HD).to(q_dtype)
    grid = [(m, s) for m in rows_grid for s in tokens_grid]
    calls = []
    for m, s in grid:
        ids = list(range(1, 1 + -(-s // BLOCK)))
        calls += [partial(attend, q, k, v, pack_segments([(list(range(m)), ids, s)]), HD ** -0.5),
                  partial(attend, q, k, v, pack_segments([([r], ids, s) for r in range(m)]), HD ** -0.5)]
    times = best_of_each(calls, reps)
    return ([(m, s, times[2 * i]) for i, (m, s) in enumerate(grid)],
            [(m, s, times[2 * i + 1]) for i, (m, s) in enumerate(grid)])


def measure_cpu_merge(rows_grid: list[int], reps: int) -> list[tuple[int, float]]:
    """(members, us) of one group's merge as CpuDecode runs it: inside the kernel call, so measured as that
    call (each row's partial results merged, paged_decode.decode) less the same segments' call without the
    merge (paged_decode.attend), a group of `members` rows and each row's own part."""
    from kvloop.engine.kernels.cpu.paged_decode import attend, decode, pack_segments

    k, v = paged_cache(torch.float32, 6)
    q = torch.randn(max(rows_grid), HEADS, HD)
    ids = list(range(1, 5))
    sizes = [m for m in rows_grid if m > 1]
    calls = []
    for m in sizes:
        segments = pack_segments([(list(range(m)), ids, 4 * BLOCK)] + [([r], ids,
                                                                        4 * BLOCK) for r in range(m)])
        calls += [partial(decode, q[:m], k, v, segments, HD ** -0.5),
                  partial(attend, q[:m], k, v, segments, HD ** -0.5)]
    times = best_of_each(calls, reps)
    return [(m, times[2 * i] - times[2 * i + 1]) for i, m in enumerate(sizes)]


def fit_cpu(stacked: list[tuple], plain: list[tuple], merges: list[tuple[int, float]]
            ) -> tuple[AttentionCost, float, float]:
    """The model, the kernel call's fixed cost (paid once per layer with or without cascade, so left out of
    the model) and the worst relative error of fixed cost + model over every sample, stacked and plain.
    The kernel widens each tile of K/V once for all the rows it stacks, then pays per row: the stacked slopes
    of 2 and more rows, per token, are a line in the rows (token_stack_us + token_row_us * M); one row alone
    is bound by reading (token_us, from the plain calls), and the line never prices it higher: its intercept
    is capped at token_us - token_row_us (a noisy line would otherwise overprice every plain row)."""
    st, pl = lines_per_rows(stacked), lines_per_rows(plain)
    rows = sorted(st)
    _, row_us = line([float(m) for m in rows], [st[m][0] for m in rows])
    fixed_us, per_segment_us = line([float(m) for m in rows], [pl[m][0] for m in rows])
    token_us = median([pl[m][1] / m for m in rows])  # a row reading the tokens alone
    stacks = [m for m in rows if m > 1]
    token_stack_us, token_row_us = line([float(m) for m in stacks], [st[m][1] for m in stacks])
    token_stack_us = min(token_stack_us, token_us - token_row_us)
    group_us, merge_us = line([float(m) for m, _ in merges], [us for _, us in merges])
    cost = AttentionCost(call_us=round(max(per_segment_us - row_us, 0.0), 3),
                         row_us=round(max(row_us, 0.0), 4),
                         token_us=round(max(token_us, 0.0), 5), token_row_us=round(max(token_row_us, 0.0), 6),
                         merge_us=round(max(merge_us, 0.0), 3), group_us=round(max(group_us, 0.0), 3),
                         token_stack_us=round(max(token_stack_us, 0.0), 5))
    fixed = max(fixed_us, 0.0)
    errors = [abs(fixed + cost.span_us(m, s) - us) / us for m, s, us in stacked]
    errors += [abs(fixed + cost.plain_us([s] * m) - us) / us for m, s, us in plain]
    return cost, round(fixed, 3), max(errors)


def measure_decodes(dtype: torch.dtype, points: list[tuple[int, int]], reps: int,
                    q_dtype: torch.dtype = torch.float32) -> list[tuple[int, int, float, float]]:
    """Per (members, shared tokens): (members, shared, plain_us, cascade_us), the kernel's whole decode of
    those rows (each with OWN_TOKENS of its own after the shared ones) plain and with the shared prefix as one
    group; queries in q_dtype."""
    from kvloop.engine.cascade.plan import build_plan
    from kvloop.engine.kernels.attention_meta import AttentionMetadata
    from kvloop.engine.kernels.cpu.paged_decode import CpuDecode

    steps = []
    own = OWN_TOKENS // BLOCK
    for members, shared in points:
        doc = shared // BLOCK  # whole blocks: groups end on a block edge (cascade_plan)
        tables = [list(range(1, 1 + doc)) + list(range(1 + doc + r * own, 1 + doc + (r + 1) * own))
                  for r in range(members)]
        lens = [shared + OWN_TOKENS] * members
        k, v = paged_cache(dtype, 1 + doc + members * own)
        q = torch.randn(members, HEADS, HD).to(q_dtype)
        plan = build_plan(tables, lens, BLOCK, lambda m, t: True)
        assert plan is not None and [(len(g.rows), g.num_tokens) for g in plan.groups] == [(members, shared)]
        for cascade in (None, plan):
            meta = AttentionMetadata(torch.zeros(members, dtype=torch.long), members, torch.tensor(tables),
                                     torch.tensor(lens), max_decode_context=lens[0], cascade=cascade)
            # one CpuDecode per path: the step's work list is built once and reused, as by every layer
            steps.append(partial(CpuDecode(), q, k, v, meta, HD ** -0.5))
    times = best_of_each(steps, reps)
    return [(m, s, times[2 * i], times[2 * i + 1]) for i, (m, s) in enumerate(points)]


def nonnegative_least_squares(columns: list[list[float]], target: list[float]) -> list[float]:
    """min |A x - y| with x >= 0, A given by its columns: a column whose free solution goes negative is held
    at 0 and the rest solved again (at most one pass per column; enough for the four terms fitted here)."""
    free = list(range(len(columns)))
    while free:
        a = torch.tensor([[columns[j][i] for j in free] for i in range(len(target))], dtype=torch.float64)
        x = torch.linalg.lstsq(a, torch.tensor(target,
                                               dtype=torch.float64).unsqueeze(1)).solution.squeeze(1).tolist()
        if min(x) >= 0:
            out = [0.0] * len(columns)
            for j, v in zip(free, x, strict=True):
                out[j] = v
            return out
        free.pop(x.index(min(x)))
    return [0.0] * len(columns)


def fit_on_decodes(cost: AttentionCost, decodes: list[tuple[int, int, float, float]]) -> tuple[AttentionCost,
                                                                                               float]:
    """The cascade-only terms refitted on whole decodes, and the worst |modelled - measured gain| / plain
    time. Single-segment calls priced a stacked row's token at about twice what whole decodes show on 2
    threads (a likely cause, not measured apart: a segment alone is few work items, 3 KV heads, for the
    threads, while in a whole decode they share the threads with the rows' own parts), so the terms that only
    cascade uses (token_stack_us, token_row_us, group_us, merge_us) come from whole decodes, and the plain
    terms (call_us, row_us, token_us) stay the segments' fit. Each decode gives, per layer, m * s * token_us -
    gain - call_us - row_us * m = s * token_stack_us
    + s * m * token_row_us + group_us + m * merge_us, weighted by 1 / plain time (relative errors). Where the
    fit puts a group's stacked cost per token below token_us, reading bounds it (the model's max): its tokens
    cost s * token_us instead, and the fit is solved again until that split no longer changes."""
    read_bound = [False] * len(decodes)  # the first fit prices every group's tokens as stacked
    fitted = _fit_cascade_terms(cost, decodes, read_bound)
    for _ in range(len(decodes)):
        now = [m > 1 and fitted.token_stack_us + fitted.token_row_us * m < cost.token_us
               for m, _, _, _ in decodes]
        if now == read_bound:
            break
        read_bound = now
        fitted = _fit_cascade_terms(cost, decodes, read_bound)
    worst = max(abs(fitted.group_gain_us(m, s) - (plain_us - cascade_us)) / plain_us
                for m, s, plain_us, cascade_us in decodes)
    return fitted, worst


def _fit_cascade_terms(cost: AttentionCost, decodes: list[tuple[int, int, float, float]],
                       read_bound: list[bool]) -> AttentionCost:
    """One least-squares fit of the cascade-only terms (fit_on_decodes), with the groups in read_bound priced
    as bound by reading their tokens."""
    columns: list[list[float]] = [[], [], [], []]
    target = []
    for (m, s, plain_us, cascade_us), bound in zip(decodes, read_bound, strict=True):
        w = 1.0 / plain_us
        for column, value in zip(columns, (0 if bound else s, 0 if bound else s * m, 1.0, float(m)),
                                 strict=True):
            column.append(value * w)
        y = m * s * cost.token_us - (plain_us - cascade_us) - cost.call_us - cost.row_us * m
        target.append((y - (s * cost.token_us if bound else 0.0)) * w)
    stack, per_row, group, merge = nonnegative_least_squares(columns, target)
    per_row = min(per_row, cost.token_us)  # a stacked row never costs more per token than reading alone
    return replace(cost, token_stack_us=round(min(stack, cost.token_us - per_row), 5),
                   token_row_us=round(per_row, 6), group_us=round(group, 3), merge_us=round(merge, 3))


def fit_margin(cost: AttentionCost, decodes: list[tuple[int, int, float, float]]) -> float:
    """The smallest min_gain (in steps of 0.01) under which the model cascades at none of these decodes where
    cascade measured slower: each such point's modelled gain over its rows' plain
    reading cost, the largest."""
    needed = [cost.group_gain_us(m, s) / (m * s * cost.token_cost_us(1))
              for m, s, plain_us, cascade_us in decodes if cascade_us > plain_us]
    return math.ceil(max([0.0, *needed]) * 100) / 100


def held_out(cost: AttentionCost, decodes: list[tuple[int, int, float, float]]) -> list[dict]:
    """The model's choice at each measured decode against the path measured faster."""
    out = []
    for members, shared, plain_us, cascade_us in decodes:
        gain = plain_us - cascade_us
        model_cascades = cost.worth(members, shared)
        out.append({"members": members, "shared_tokens": shared, "plain_us": round(plain_us, 1),
                    "cascade_us": round(cascade_us, 1), "measured_gain_us": round(gain, 1),
                    "model_gain_us": round(cost.group_gain_us(members, shared), 1),
                    "model_cascades": model_cascades,
                    "agrees": model_cascades == (gain > 0), "tie": abs(gain) <= TIE * plain_us})
    return out


def paste_line(name: str, cost: AttentionCost, width: int = 110) -> str:
    """`name = AttentionCost(...)` wrapped to the project's line length, ready to paste."""
    head = f"{name} = AttentionCost("
    lines, cur = [], head
    for i, (field, value) in enumerate(cost.__dict__.items()):
        arg = f"{field}={value!r}" + (")" if i == len(cost.__dict__) - 1 else ",")
        if len(cur) + len(arg) + 1 > width and cur.strip() != head.strip():
            lines.append(cur.rstrip())
            cur = " " * len(head)
        cur += arg + " "
    return "\n".join([*lines, cur.rstrip()])


def calibrate_cpu(result: dict, rows_grid: list[int], tokens_grid: list[int], points: list[tuple[int, int]],
                  margin_points: list[tuple[int, int]], reps: int) -> list[str]:
    """Fills result["dtypes"] for the CPU kernel; returns the lines to paste into cascade/cost.py."""
    merges = measure_cpu_merge(rows_grid, reps)  # the kernel is loaded (cpu_cost_name)
    paste, summary = [], []
    names = entry_names(result["cost_name"])
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        if name not in names:
            continue
        q_dtype = query_dtype(result["cost_name"], dtype)
        stacked, plain = measure_cpu(dtype, rows_grid, tokens_grid, reps, q_dtype)
        segments, fixed_us, worst = fit_cpu(stacked, plain, merges)
        decodes = measure_decodes(dtype, margin_points, reps, q_dtype)
        cost, decode_worst = fit_on_decodes(segments, decodes)
        cost = replace(cost, min_gain=fit_margin(cost, decodes))
        checks = held_out(cost, measure_decodes(dtype, points, reps, q_dtype))
        evens = {m: break_even(cost, m) for m in (2, 4, 8, 16, 32)}
        wrong = [c for c in checks if not c["agrees"] and not c["tie"]]  # either way
        missed = [c for c in wrong if not c["model_cascades"]]
        result["dtypes"][name] = {
            "cost": cost.__dict__, "query_dtype": str(q_dtype).removeprefix("torch."),
            "call_fixed_us": fixed_us,
            "fit_worst_relative_error": round(worst, 3),
            "segment_fit_cost": segments.__dict__, "decode_fit_worst_gain_error": round(decode_worst, 3),
            "fit_decodes": [{"members": m, "shared_tokens": sh, "plain_us": round(p, 1),
                             "cascade_us": round(c, 1)}
                            for m, sh, p, c in decodes],
            "break_even_tokens": evens,
            "held_out_agreement": round(sum(c["agrees"] for c in checks) / len(checks), 3),
            "held_out_wrong_beyond_tie": len(wrong),
            "held_out_cascaded_slower_beyond_tie": len(wrong) - len(missed),
            "held_out": checks,
            "samples_us": {"stacked": stacked, "plain": plain, "merge": merges}}
        paste.append(paste_line(names[name], cost))
        even = {m: "never" if n is None else f"{n:,}" for m, n in evens.items()}
        summary.append(f"{name}: segments fit within {worst:.0%}, cascade terms on whole decodes within "
                       f"{decode_worst:.0%} of a step, margin {cost.min_gain:.2f}, break-even shared tokens "
                       f"{even[2]} for 2 sharers, {even[4]} for 4, {even[16]} for 16")
        print(f"{name}: segment fit worst relative error {worst:.1%} (call fixed cost {fixed_us} us), "
              f"cascade terms refitted on {len(decodes)} whole decodes (worst gain error {decode_worst:.1%} "
              f"of a plain step), margin {cost.min_gain:.2f}; held-out: the slower path picked at "
              f"{len(wrong)} points, {len(missed)} of them plain (beyond {TIE:.0%}); break-even shared "
              f"tokens by group size: {evens}")
        for c in checks:
            verdict = "" if c["agrees"] else " (tie)" if c["tie"] else " WRONG"
            print(f"  {c['members']:3d} rows x {c['shared_tokens']:5d} shared: plain {c['plain_us']:8.1f} "
                  f"us, cascade {c['cascade_us']:8.1f} us; model "
                  f"{'cascades' if c['model_cascades'] else 'plain'}{verdict}")
    return ["# " + "; ".join(summary), *paste]


def cpu_goals(result: dict) -> list[dict]:
    """Each fit's worst sample within 50% (as for the torch path; the segments' fit and the whole decodes' fit
    of the cascade terms), and no held-out point where the model's choice is the path measured slower by more
    than TIE."""
    out = []
    for name, d in result["dtypes"].items():
        out += [goal(f"cpu {name}: fit worst relative error", d["fit_worst_relative_error"], "<=", 0.5),
                goal(f"cpu {name}: whole-decode fit of the cascade terms, worst gain error / plain step",
                     d["decode_fit_worst_gain_error"], "<=", 0.5),
                goal(f"cpu {name}: held-out points where the model picks the path measured slower by more "
                     f"than {TIE:.0%}", d["held_out_wrong_beyond_tie"], "<=", 0,
                     agreement=d["held_out_agreement"])]
    return out


def calibrate_torch(result: dict, rows_grid: list[int], tokens_grid: list[int], reps: int) -> None:
    """Fills result["dtypes"] for the torch decode path, printing its COSTS entries."""
    merge_us = measure_merge(16, reps)
    for dtype in (torch.bfloat16, torch.float32):
        samples = measure(dtype, rows_grid, tokens_grid, reps)
        cost, worst = fit(samples, merge_us)
        cost = AttentionCost(**{**cost.__dict__, "copy_max_tokens": copy_crossover(dtype, tokens_grid, reps)})
        name = str(dtype).removeprefix("torch.")
        evens = {m: break_even(cost, m) for m in (2, 4, 8, 16, 32)}
        result["dtypes"][name] = {"cost": cost.__dict__, "fit_worst_relative_error": round(worst, 3),
                                  "break_even_tokens": evens, "samples_us": samples}
        print(f'    "{name}": {cost!r},')
        print(f"      fit worst relative error {worst:.1%}; break-even shared tokens by group size: {evens}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("torch", "cpu"), default="torch",
                   help="the decode path to measure: the torch path or the C++ CPU kernel")
    p.add_argument("--quick", action="store_true", help="a tiny grid (smoke run)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None,
                   help="default: bench/results/cascade_calibration[_cpu[_avx512bf16|_amx]].json "
                                               "(the cpu backend's cost name on this CPU)")
    args = p.parse_args()
    cost_name = cpu_cost_name() if args.backend == "cpu" else "torch"
    stem = "" if cost_name == "torch" else "_" + cost_name.replace("/", "_")
    out = Path(args.out or f"bench/results/cascade_calibration{stem}.json")
    torch.set_num_threads(args.threads)
    rows_grid = [1, 2, 4, 8, 16, 32]
    tokens_grid = [64, 256, 1024, 2048]
    if args.quick:  # the kernel's stacks need two sizes of 2 rows and more; its contexts, a long one
        rows_grid, tokens_grid = ([1, 4, 16], [64, 512]) if args.backend == "torch" else ([1, 2, 4, 16],
                                                                                          [64, 2048])
    # the kernel's grid is quick to time
    reps = 20 if not args.quick else 3 if args.backend == "torch" else 10
    result = {"threads": args.threads, "cpu": platform.processor() or platform.machine(), "dtypes": {}}
    if args.backend == "torch":
        calibrate_torch(result, rows_grid, tokens_grid, reps)
        result["goals"] = calibration_goals(result)
    else:
        from kvloop.engine.core.cpu import cpu_flags

        result.update(backend="cpu", cost_name=cost_name, quick=args.quick, cpu_flags=cpu_flags())
        paste = calibrate_cpu(result, rows_grid, tokens_grid, HELD_OUT_QUICK if args.quick else HELD_OUT,
                              MARGIN_QUICK if args.quick else MARGIN, reps)
        result["goals"] = cpu_goals(result)
        command = (f"bench/calibrate_cascade.py --backend cpu --threads {args.threads}"
                   f"{' --quick' if args.quick else ''}")
        entries = " and ".join(entry_names(cost_name).values())
        print(f"\n# --- paste into engine/cascade/cost.py in place of the {entries} lines, and "
              f"update their comment: `{command}` on {result['cpu_flags']['model']} ---")
        print("\n".join(paste))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
