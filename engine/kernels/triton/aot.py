"""Ahead-of-time compile check: every kernel, in the configurations the wrappers launch, compiled for
sm_90 and sm_80 without a GPU (TTIR -> TTGIR -> LLIR -> PTX -> cubin with the ptxas in triton's wheel).
Catches what the interpreter lets through: unsupported dot shapes, layout/type errors, shared-memory
overflow, register spills. Must run WITHOUT TRITON_INTERPRET (interpreted kernels cannot be compiled):

    python -P -m kvloop.engine.kernels.triton.aot [--targets 90,80] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ._common import dot_config, next_pow2
from .block_copy import COPY_BLOCK, copy_blocks_kernel
from .cascade import cascade_shared_kernel, shared_tiles
from .decode import decode_merge_kernel, decode_split_kernel, decode_warps, tile_tokens
from .extend import extend_kernel, extend_tiles
from .kv_write import write_kv_kernel
from .rmsnorm import rmsnorm_kernel

SHARED_LIMIT = {90: 232448, 80: 166912}  # bytes of shared memory one block may use (opt-in maximum)
PTR_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# Pointer arguments that are not of the cache dtype.
FIXED_PTRS = {
    "bt_ptr": "*i32", "ctx_ptr": "*i32", "qsl_ptr": "*i32", "seq_lens_ptr": "*i32",
    "start_ptr": "*i32", "seg_info_ptr": "*i32", "seg_rows_ptr": "*i32", "row_slots_ptr": "*i32",
    "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
    "slot_ptr": "*i64", "src_ids_ptr": "*i64", "dst_ids_ptr": "*i64",
}


@dataclass
class Spec:
    name: str
    kernel: Any
    dtype: torch.dtype
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    # these pointers' dtype when it differs from the cache's (fp32 model, 16-bit KV)
    io_dtype: torch.dtype | None = None
    io_ptrs: tuple[str, ...] = ("q_ptr", "out_ptr")


def signature(spec: Spec) -> tuple[dict[str, str], dict[tuple[int, ...], list[list[Any]]]]:
    """Types and the 16-divisibility hints a real launch would specialise on: torch allocations are
    16-byte aligned and the strides of these layouts are multiples of 16."""
    sig: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, arg in enumerate(spec.kernel.arg_names):
        if arg in spec.constexprs:
            sig[arg] = "constexpr"
        elif arg.endswith("_ptr"):
            io = spec.io_dtype is not None and arg in spec.io_ptrs
            sig[arg] = PTR_TYPES[spec.io_dtype] if io else FIXED_PTRS.get(arg, PTR_TYPES[spec.dtype])
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif arg in ("scale_log2", "eps"):
            sig[arg] = "fp32"
        else:
            sig[arg] = "i32"
            if arg.startswith("stride_") or arg.endswith(("_b", "_l", "_kv")):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def specs() -> list[Spec]:
    """Llama-3-8B-like (hd 128, 8 KV heads, group 4), SmolLM-like (hd 64, group 3) and fp32 variants."""
    out: list[Spec] = []
    for dtype, n_kv, hd, bs in [(torch.bfloat16, 8, 128, 16), (torch.float32, 3, 64, 32)]:
        out.append(Spec(f"write_kv/{NAMES[dtype]}/hd{hd}", write_kv_kernel, dtype, dict(
            N_KV=n_kv, HEAD_DIM=hd, BLOCK_SIZE=bs, BLOCK_H=next_pow2(n_kv), BLOCK_D=next_pow2(hd))))
    for dtype, group, hd, bs, split, start in [
        (torch.bfloat16, 4, 128, 16, True, False), (torch.bfloat16, 4, 128, 16, False, False),
        (torch.float16, 3, 64, 32, True, False), (torch.float32, 8, 128, 16, False, False),
        (torch.bfloat16, 4, 128, 16, True, True), (torch.float32, 3, 64, 16, True, True),  # cascade suffixes
    ]:
        dot_t, prec = dot_config(dtype)
        out.append(Spec(f"decode/{NAMES[dtype]}/g{group}/hd{hd}/split{int(split)}/start{int(start)}",
                        decode_split_kernel, dtype, dict(
            GROUP=group, BLOCK_SIZE=bs, HEAD_DIM=hd, BLOCK_H=max(16, next_pow2(group)), BLOCK_D=next_pow2(hd),
            BLOCK_N=tile_tokens(hd, dtype), DOT_T=dot_t, PREC=prec, SPLIT=split, HAS_START=start),
            num_warps=decode_warps(dtype)))
    # Cascade's shared-prefix kernel: 16 sharers (a full 64-row tile) and 2 sharers (the 16-row minimum).
    for dtype, group, hd, bs, members in [
        (torch.bfloat16, 4, 128, 16, 16), (torch.bfloat16, 4, 128, 16, 2), (torch.float16, 3, 64, 32, 16),
        (torch.float32, 4, 128, 16, 16), (torch.float32, 3, 64, 16, 2),
    ]:
        dot_t, prec = dot_config(dtype)
        block_m, block_n, warps = shared_tiles(members, group, hd, dtype)
        out.append(Spec(f"cascade_shared/{NAMES[dtype]}/g{group}/hd{hd}/m{block_m}", cascade_shared_kernel,
                        dtype,
                        dict(GROUP=group, BLOCK_SIZE=bs, HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_D=next_pow2(hd),
                             BLOCK_N=block_n, DOT_T=dot_t, PREC=prec), num_warps=warps))
    # An fp32 model over a bf16 KV cache: fp32 queries, outputs and new K/V, bf16 pages.
    bf16, fp32 = torch.bfloat16, torch.float32
    dot_t, prec = dot_config(bf16)
    out.append(Spec("write_kv/fp32-into-bf16/hd128", write_kv_kernel, bf16, dict(
        N_KV=8, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_H=8, BLOCK_D=128), io_dtype=fp32,
        io_ptrs=("k_ptr", "v_ptr")))
    out.append(Spec("decode/fp32q-bf16kv/g4/hd128/split0/start1", decode_split_kernel, bf16, dict(
        GROUP=4, BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_H=16, BLOCK_D=128, BLOCK_N=tile_tokens(128, bf16),
        DOT_T=dot_t, PREC=prec, SPLIT=False, HAS_START=True), num_warps=decode_warps(bf16), io_dtype=fp32))
    block_m, block_n, warps = shared_tiles(16, 4, 128, bf16)
    out.append(Spec("cascade_shared/fp32q-bf16kv/g4/hd128", cascade_shared_kernel, bf16, dict(
        GROUP=4, BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_M=block_m, BLOCK_D=128, BLOCK_N=block_n, DOT_T=dot_t,
        PREC=prec), num_warps=warps, io_dtype=fp32))
    block_m, block_n, warps = extend_tiles(128, bf16)
    out.append(Spec("extend/fp32q-bf16kv/g4/hd128", extend_kernel, bf16, dict(
        GROUP=4, BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=128, DOT_T=dot_t,
        PREC=prec), num_warps=warps, io_dtype=fp32))
    for row_slots in (False, True):  # plain split-K, and cascade's per-row slots
        out.append(Spec(f"decode_merge/hd128/rows{int(row_slots)}", decode_merge_kernel, torch.bfloat16, dict(
            HEAD_DIM=128, BLOCK_D=128, BLOCK_S=8 if not row_slots else 32, HAS_ROW_SLOTS=row_slots)))
    for dtype, group, hd, bs in [(torch.bfloat16, 4, 128, 16), (torch.float16, 3, 64, 32),
                                 (torch.float32, 1, 128, 16)]:
        dot_t, prec = dot_config(dtype)
        block_m, block_n, warps = extend_tiles(hd, dtype)
        out.append(Spec(f"extend/{NAMES[dtype]}/g{group}/hd{hd}", extend_kernel, dtype, dict(
            GROUP=group, BLOCK_SIZE=bs, HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_pow2(hd),
            DOT_T=dot_t, PREC=prec), num_warps=warps))
    for dtype, has_res, block in [(torch.bfloat16, True, 4096), (torch.float32, False, 1024)]:
        out.append(Spec(f"rms_norm/{NAMES[dtype]}/res{int(has_res)}", rmsnorm_kernel, dtype, dict(
            HAS_RES=has_res, BLOCK=block), num_warps=min(block // 256, 16)))
    for dtype in (torch.bfloat16, torch.float32):
        out.append(Spec(f"copy_blocks/{NAMES[dtype]}", copy_blocks_kernel, dtype, dict(BLOCK=COPY_BLOCK),
                        num_stages=1))
    return out


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack and local (spill) bytes per thread, from the cuobjdump shipped with triton."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text)}


def compile_one(spec: Spec, arch: int) -> dict[str, Any]:
    sig, attrs = signature(spec)
    src = ASTSource(fn=spec.kernel, signature=sig, constexprs=spec.constexprs, attrs=attrs)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"kernel": spec.name, "arch": f"sm_{arch}"}
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    except Exception as e:  # noqa: BLE001 - reported per kernel, the run goes on
        result.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
        return result
    shared = int(compiled.metadata.shared)
    usage = resource_usage(compiled.asm["cubin"]) if "cubin" in compiled.asm else {}
    problems = []
    if shared > SHARED_LIMIT[arch]:
        problems.append(f"shared memory {shared} B > {SHARED_LIMIT[arch]}")
    spill = usage.get("stack", 0) + usage.get("local", 0)
    if spill:  # ptxas puts spilled registers on the per-thread stack
        problems.append(f"register spills: {spill} B stack/local per thread at {usage.get('reg')} registers")
    result.update(
        ok=not problems, problems=problems, stages=sorted(compiled.asm), shared_bytes=shared,
        seconds=round(time.perf_counter() - t0, 2), **usage,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="90,80", help="comma-separated compute capabilities")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    results = [compile_one(spec, int(arch)) for arch in args.targets.split(",") for spec in specs()]
    ok = all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "triton": triton.__version__, "results": results}))
    else:
        for r in results:
            detail = r.get("error") or ", ".join(r["problems"]) or (
                f"reg {r.get('reg', '?')}  shared {r['shared_bytes']} B  {'+'.join(r['stages'])}  "
                f"{r['seconds']} s")
            print(f"{'ok ' if r['ok'] else 'BAD'} {r['arch']} {r['kernel']:<36} {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
