"""Every kernel against a float64 torch reference, then timed: decode bandwidth against the measured copy
bandwidth (goal >= 70% at batch 64, context 2k, Llama-3-8B heads), cascade against plain decode with
16 rows per shared prefix, extend FLOP rate, write/copy rates.
`small=True` shrinks every shape for the CPU dry run under the interpreter."""

from __future__ import annotations

import math
from typing import Any

import torch
from cases import PagedKV, decode_ref, extend_ref, make_paged, share_pages
from timing import time_rotating

from kvloop.engine.kernels import reference

# (atol, rtol) against float64 on the GPU. 16-bit kernels round the softmax weights to the input dtype
# before the P.V product (tensor cores), so they get a little more than the interpreter tests allow.
GPU_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _compare(name: str, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, **shape: Any) -> dict[str,
                                                                                                        Any]:
    atol, rtol = GPU_TOL[dtype]
    err = (out.double() - ref).abs()
    bound = atol + rtol * ref.abs()
    return {
        "kernel": name, "dtype": NAMES[dtype], **shape,
        "max_abs_err": float(err.max()), "worst_err_over_bound": float((err / bound).max()),
        "nan": bool(out.isnan().any()), "atol": atol, "rtol": rtol,
        "ok": bool((err <= bound).all()) and not bool(out.isnan().any()),
    }


def check_decode(tk, device, gen, dtype, n_kv, group, hd, bs, lens, splits=None) -> dict[str, Any]:
    kv = make_paged(lens, bs, n_kv, hd, dtype, device, gen)
    q = torch.randn(len(lens), n_kv * group, hd, device=device, dtype=dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)
    out = tk.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, ctx, hd**-0.5,
                                    num_splits=splits)
    return _compare("decode", out, decode_ref(q, kv, lens, hd**-0.5), dtype,
                    group=group, head_dim=hd, block_size=bs, max_ctx=max(lens), splits=splits or "auto")


def check_cascade(tk, device, gen, dtype, n_kv, group, hd, bs, lens, segments, splits=None) -> dict[str, Any]:
    """Cascade over pages really shared by each segment's rows, against float64 plain attention per row."""
    kv = make_paged(lens, bs, n_kv, hd, dtype, device, gen)
    share_pages(kv, segments, bs)
    q = torch.randn(len(lens), n_kv * group, hd, device=device, dtype=dtype)
    ctx = torch.tensor(lens, dtype=torch.int32, device=device)
    out = tk.cascade_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, ctx, hd**-0.5, segments,
                                      num_splits=splits)
    return _compare("cascade", out, decode_ref(q, kv, lens, hd**-0.5), dtype, group=group, head_dim=hd,
                    block_size=bs, max_ctx=max(lens), segments=len(segments),
                    levels=1 + max(s.level for s in segments), max_members=max(len(s.rows) for s in segments))


def cascade_checks(tk, device, gen, small: bool) -> list[dict[str, Any]]:
    """Groups of 1, 2 and 16, prefixes ending mid-block and on a block edge, nested levels, three dtypes."""
    seg = tk.CascadeSegment
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    if small:
        lens = [40, 45, 37, 30, 20]
        nested = [seg(0, 0, 16, (0, 1, 2, 3)), seg(1, 16, 35, (0, 1, 2)), seg(2, 35, 36, (0,))]
        return [check_cascade(tk, device, gen, bf16, 2, 4, 64, 16, lens, nested),
                check_cascade(tk, device, gen, fp16, 2, 3, 64, 16, lens, [seg(0, 0, 29, (1, 3))], splits=2)]
    lens = [2000 + 37 * i for i in range(32)]
    halves = [seg(0, 0, 1900, tuple(range(16))), seg(0, 0, 1888, tuple(range(16, 32)))]
    nested = [seg(0, 0, 300, tuple(range(32))), seg(1, 300, 1999, tuple(range(16))),
              seg(1, 300, 1024, tuple(range(16, 30))), seg(2, 1024, 1500, (16, 17))]
    return [
        check_cascade(tk, device, gen, bf16, 8, 4, 128, 16, lens, halves),
        check_cascade(tk, device, gen, bf16, 8, 4, 128, 16, lens, nested),
        check_cascade(tk, device, gen, bf16, 8, 4, 128, 16, lens[:3], [seg(0, 0, 1000, (1,))], splits=1),
        check_cascade(tk, device, gen, fp16, 3, 3, 64, 32, lens, nested, splits=3),
        check_cascade(tk, device, gen, fp32, 8, 4, 128, 16, lens, halves),
        check_cascade(tk, device, gen, fp32, 3, 3, 64, 16, lens[:4], [seg(0, 0, 512, (0, 2))]),
    ]


def check_extend(tk, device, gen, dtype, n_kv, group, hd, bs, seqs) -> dict[str, Any]:
    kv = make_paged([p + n for p, n in seqs], bs, n_kv, hd, dtype, device, gen)
    q = torch.randn(sum(n for _, n in seqs), n_kv * group, hd, device=device, dtype=dtype)
    qsl = torch.tensor([0] + [n for _, n in seqs], device=device).cumsum(0).to(torch.int32)
    lens = torch.tensor([p + n for p, n in seqs], dtype=torch.int32, device=device)
    out = tk.paged_extend_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, lens, hd**-0.5)
    return _compare("extend", out, extend_ref(q, kv, seqs, hd**-0.5), dtype,
                    group=group, head_dim=hd, block_size=bs, seqs=str(seqs))


def check_write_and_copy(tk, device, gen, dtype) -> list[dict[str, Any]]:
    """Exact-copy kernels: compared bit for bit with torch indexing."""
    layers, blocks, bs, n_kv, hd = 2, 64, 16, 8, 128
    kv = torch.zeros(layers, 2, blocks, bs, n_kv, hd, device=device, dtype=dtype)
    n = 300
    slots = torch.randperm(blocks * bs, generator=gen)[:n].to(device)
    slots[::7] = -1
    k = torch.randn(n, n_kv, hd, device=device, dtype=dtype)
    v = torch.randn(n, n_kv, hd, device=device, dtype=dtype)
    tk.write_kv(k, v, kv[1, 0], kv[1, 1], slots)
    expect = torch.zeros_like(kv[1])
    reference.write_kv(k, v, expect[0], expect[1], slots)
    write_ok = torch.equal(kv[1], expect) and not kv[0].any()

    dst = torch.zeros(layers, 2, 40, bs, n_kv, hd, device=device, dtype=dtype)
    src_ids = torch.randperm(blocks, generator=gen)[:12].to(device)
    dst_ids = torch.randperm(40, generator=gen)[:12].to(device)
    tk.copy_blocks(kv, dst, src_ids, dst_ids)
    expect = torch.zeros_like(dst)
    expect[:, :, dst_ids] = kv[:, :, src_ids]
    return [{"kernel": "write_kv", "dtype": NAMES[dtype], "exact": True, "ok": write_ok},
            {"kernel": "copy_blocks", "dtype": NAMES[dtype], "exact": True, "ok": torch.equal(dst, expect)}]


def check_rmsnorm(tk, device, dtype, rows: int, hidden: int) -> dict[str, Any]:
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    res = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    out, new_res = tk.rms_norm(x, w, 1e-5, res)
    total = (x.double() + res.double()).to(dtype).double()
    ref = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    row = _compare("rms_norm", out, ref, dtype, hidden=hidden)
    row["ok"] = row["ok"] and torch.equal(new_res.double(), total)
    return row


def run_checks(tk, device: torch.device, small: bool) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(1234)
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    if small:
        lens, seqs = [1, 37, 70], [(0, 20), (33, 5), (5, 1)]
        return [
            check_decode(tk, device, gen, bf16, 2, 4, 64, 16, lens),
            check_decode(tk, device, gen, fp16, 2, 3, 64, 32, lens, splits=2),
            check_extend(tk, device, gen, bf16, 2, 4, 64, 16, seqs),
            check_rmsnorm(tk, device, fp32, 3, 64),
            *check_write_and_copy(tk, device, gen, bf16),
            *cascade_checks(tk, device, gen, small),
        ]
    lens = [1, 15, 17, 333, 1000, 2049, 3001, 4096]
    seqs = [(0, 700), (1500, 300), (37, 1), (200, 129), (4000, 64)]
    return [
        check_decode(tk, device, gen, bf16, 8, 4, 128, 16, lens),
        check_decode(tk, device, gen, bf16, 8, 4, 128, 16, lens[:3], splits=1),
        check_decode(tk, device, gen, fp16, 3, 3, 64, 32, lens, splits=5),
        check_decode(tk, device, gen, fp32, 4, 1, 128, 16, lens),
        check_decode(tk, device, gen, bf16, 1, 8, 128, 32, lens),
        check_extend(tk, device, gen, bf16, 8, 4, 128, 16, seqs),
        check_extend(tk, device, gen, fp16, 2, 8, 64, 32, seqs),
        check_extend(tk, device, gen, fp32, 3, 3, 128, 16, seqs[1:3]),
        check_rmsnorm(tk, device, bf16, 64, 4096),
        check_rmsnorm(tk, device, fp16, 7, 576),
        *check_write_and_copy(tk, device, gen, bf16),
        *check_write_and_copy(tk, device, gen, fp32),
        *cascade_checks(tk, device, gen, small),
    ]


def bench_decode(tk, device: torch.device, copy_gbps: float, batch: int, ctx: int, n_heads: int, n_kv: int,
                 hd: int, bs: int = 16, rotate: int = 3, reps: int = 50) -> dict[str, Any]:
    """Decode attention over `rotate` independent input sets; bytes = K+V read plus q and out."""
    dtype, gen = torch.bfloat16, torch.Generator().manual_seed(7)
    sets = []
    for _ in range(rotate):
        kv: PagedKV = make_paged([ctx] * batch, bs, n_kv, hd, dtype, device, gen)
        q = torch.randn(batch, n_heads, hd, device=device, dtype=dtype)
        sets.append((q, kv, torch.full((batch,), ctx, dtype=torch.int32, device=device)))
    fns = [lambda q=q, kv=kv,
           c=c: tk.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, c, hd**-0.5)
           for q, kv, c in sets]
    t = time_rotating(fns, device, reps=reps)
    elem = torch.finfo(dtype).bits // 8
    nbytes = (batch * ctx * n_kv * hd * elem * 2 + 2 * batch * n_heads * hd * elem
              + batch * math.ceil(ctx / bs) * 4)
    gbps = nbytes / (t["median_ms"] * 1e-3) / 1e9
    return {"batch": batch, "ctx": ctx, "n_heads": n_heads, "n_kv": n_kv, "head_dim": hd, "block_size": bs,
            **t, "bytes": nbytes, "GBps": gbps, "fraction_of_copy": gbps / copy_gbps}


def bench_cascade(tk, device: torch.device, batch: int, ctx: int, share: int, shared: int, n_heads: int,
                  n_kv: int, hd: int, bs: int = 16, reps: int = 50) -> dict[str, Any]:
    """Plain decode vs cascade on the same pages: groups of `share` rows hold their first `shared` tokens
    in the same pages. The plan is packed once (as the runner does per step, for every layer); its host
    cost is reported apart."""
    import time

    dtype, gen = torch.bfloat16, torch.Generator().manual_seed(10)
    seg = tk.CascadeSegment
    segments = [seg(0, 0, shared, tuple(range(g, min(g + share, batch)))) for g in range(0, batch, share)]
    sets = []
    for _ in range(2):
        kv = make_paged([ctx] * batch, bs, n_kv, hd, dtype, device, gen)
        share_pages(kv, segments, bs)
        sets.append((torch.randn(batch, n_heads, hd, device=device, dtype=dtype), kv))
    ctx_t = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    t0 = time.perf_counter()
    packed = tk.pack_for(segments, sets[0][0], sets[0][1].k_cache)
    pack_ms = (time.perf_counter() - t0) * 1e3
    plain = time_rotating([lambda q=q, kv=kv: tk.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, ctx_t, hd**-0.5) for q, kv in sets], device, reps=reps)
    casc = time_rotating([lambda q=q, kv=kv: tk.cascade_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, ctx_t, hd**-0.5, packed) for q, kv in sets], device,
        reps=reps)
    elem = torch.finfo(dtype).bits // 8
    kv_bytes = lambda tokens: tokens * n_kv * hd * elem * 2  # noqa: E731 - K and V of that many tokens
    q0, kv0 = sets[0]
    a = tk.paged_decode_attention(q0, kv0.k_cache, kv0.v_cache, kv0.block_tables, ctx_t, hd**-0.5)
    b = tk.cascade_decode_attention(q0, kv0.k_cache, kv0.v_cache, kv0.block_tables, ctx_t, hd**-0.5, packed)
    return {
        "batch": batch, "ctx": ctx, "rows_per_share": share, "shared_tokens": shared, "groups": len(segments),
        "n_heads": n_heads, "n_kv": n_kv, "head_dim": hd, "block_size": bs,
        "plain_ms": plain["median_ms"], "cascade_ms": casc["median_ms"], "plain": plain, "cascade": casc,
        "speedup": plain["median_ms"] / casc["median_ms"], "pack_host_ms": pack_ms,
        "shared_splits": packed.shared_splits,
        "plain_kv_bytes": kv_bytes(batch * ctx),
        "cascade_kv_bytes": kv_bytes(len(segments) * shared + batch * (ctx - shared)),
        "max_abs_diff_vs_plain": float((a.double() - b.double()).abs().max()),
    }


def sweep_decode(tk, device, copy_gbps: float, shape: dict[str, int], reps: int) -> list[dict[str, Any]]:
    """A few launch configurations of the decode kernel, to show how far the default is from the best."""
    from kvloop.engine.kernels.triton import decode

    saved = dict(decode.TUNING)
    rows = []
    try:
        for block_n, warps, stages in [(32, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 2),
                                       (128, 8, 3)]:
            decode.TUNING.update(block_n=block_n, num_warps=warps, num_stages=stages)
            row: dict[str, Any] = {"block_n": block_n, "num_warps": warps, "num_stages": stages}
            try:
                r = bench_decode(tk, device, copy_gbps, rotate=2, reps=reps, **shape)
                row.update(median_ms=r["median_ms"], fraction_of_copy=r["fraction_of_copy"])
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: this row only
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
    finally:
        decode.TUNING.clear()
        decode.TUNING.update(saved)
    return rows


def bench_extend(tk, device, batch: int, prefix: int, new: int, n_heads: int, n_kv: int, hd: int,
                 reps: int = 20) -> dict[str, Any]:
    dtype, gen = torch.bfloat16, torch.Generator().manual_seed(8)
    seqs = [(prefix, new)] * batch
    sets = []
    for _ in range(2):
        kv = make_paged([prefix + new] * batch, 16, n_kv, hd, dtype, device, gen)
        q = torch.randn(batch * new, n_heads, hd, device=device, dtype=dtype)
        sets.append((q, kv))
    qsl = torch.arange(0, batch * new + 1, new, dtype=torch.int32, device=device)
    lens = torch.full((batch,), prefix + new, dtype=torch.int32, device=device)
    fns = [lambda q=q, kv=kv: tk.paged_extend_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, qsl, lens,
                                                        hd**-0.5, max_q_len=new) for q, kv in sets]
    t = time_rotating(fns, device, reps=reps)
    # Causal FLOPs actually needed: each query attends to prefix + its own index + 1 keys; 2 GEMMs.
    keys = batch * (new * prefix + new * (new + 1) / 2)
    flops = 4 * n_heads * hd * keys
    return {"seqs": str(seqs[:1]) + f" x{batch}", **t, "TFLOPs": flops / (t["median_ms"] * 1e-3) / 1e12}


def bench_write_and_copy(tk, device, n_tokens: int, n_kv: int, hd: int, layers: int, n_blocks: int,
                         reps: int = 30) -> dict[str, Any]:
    dtype, gen = torch.bfloat16, torch.Generator().manual_seed(9)
    bs, pool = 16, max(4 * n_blocks, n_tokens // 16 + 1)
    caches = [torch.zeros(pool, bs, n_kv, hd, device=device, dtype=dtype) for _ in range(4)]
    ks = [torch.randn(n_tokens, n_kv, hd, device=device, dtype=dtype) for _ in range(2)]
    slots = torch.randperm(pool * bs, generator=gen)[:n_tokens].to(device)
    fns = [lambda i=i: tk.write_kv(ks[i % 2], ks[(i + 1) % 2], caches[2 * i], caches[2 * i + 1],
                                   slots) for i in range(2)]
    tw = time_rotating(fns, device, reps=reps)
    elem = 2
    write_bytes = 2 * 2 * n_tokens * n_kv * hd * elem  # read k, v and write them

    src = torch.randn(layers, 2, pool, bs, n_kv, hd, device=device, dtype=dtype)
    dst = torch.zeros_like(src)
    pairs = [(torch.randperm(pool, generator=gen)[:n_blocks].to(device),
              torch.randperm(pool, generator=gen)[:n_blocks].to(device)) for _ in range(3)]
    fns = [lambda s=s, d=d: tk.copy_blocks(src, dst, s, d) for s, d in pairs]
    tc = time_rotating(fns, device, reps=reps)
    copy_bytes = 2 * layers * 2 * n_blocks * bs * n_kv * hd * elem
    return {
        "write_kv": {"tokens": n_tokens, **tw, "GBps": write_bytes / (tw["median_ms"] * 1e-3) / 1e9},
        "copy_blocks": {"blocks": n_blocks, "layers": layers, **tc,
                        "GBps": copy_bytes / (tc["median_ms"] * 1e-3) / 1e9},
    }
