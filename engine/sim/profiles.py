"""Hardware + model profiles for the cost model. The CPU profile's efficiencies come from
bench/sim_calibrate.py (real EngineCore steps on this machine) and its decode attention from the
measured step-cost model of its KV dtype (cascade/cost.py, bench/calibrate_cascade.py); the GPU
ones are stated assumptions, their decode attention derived from the roofline (sim/cost.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from kvloop.engine.cascade.cost import AttentionCost, cost_for
from kvloop.engine.sim.cost import CostModel, Efficiency, Hardware, ModelShape

SMOLLM2_135M = ModelShape("SmolLM2-135M", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                          vocab=49152, dtype_bytes=2, tied_embeddings=True, context=8192)
# Llama-3.1-8B: Llama-3-8B's shape with a 131,072-token context. The name stays the one runs were keyed by (it
# salts the prefix hashes and names the model in results), so earlier runs reproduce.
LLAMA3_8B = ModelShape("Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                       vocab=128256, dtype_bytes=2, context=131072)
# W5's GPU scale: FP8 weights (1 byte per parameter, ~70 GB with the embedding and head) and bf16 KV
# (2 * 80 layers * 8 KV heads * 128 * 2 bytes = 320 KiB per token).
LLAMA31_70B_FP8 = ModelShape("Llama-3.1-70B-FP8", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                             ffn=28672, vocab=128256, dtype_bytes=1, kv_dtype_bytes=2, context=131072)

# Nominal figures; the efficiencies carry what is actually reached.
THIS_CPU = Hardware("this CPU (2 threads)", mem_bw=30e9, peak_flops=200e9, mem_bytes=8e9, link_bw=10e9,
                    disk_bw=1e9)
# PCIe Gen5 x16 moves about 50 GB/s each way in practice; a datacenter NVMe about 5 GB/s.
H100 = Hardware("H100 SXM", mem_bw=3.35e12, peak_flops=989e12, mem_bytes=80e9, link_bw=50e9, disk_bw=5e9)
H200 = Hardware("H200", mem_bw=4.8e12, peak_flops=989e12, mem_bytes=141e9, link_bw=50e9, disk_bw=5e9)
# An FP8 checkpoint runs its GEMMs on the FP8 tensor cores (W8A8, as vLLM serves FP8 models on Hopper): the
# dense FP8 peak, twice the bf16 one. Attention stays bf16 but is bandwidth-bound in decode.
H200_FP8 = replace(H200, name="H200 (FP8 GEMMs)", peak_flops=1979e12)

# GPU assumptions: ~80% of bandwidth on weight/KV streaming and ~60% MFU on prefill GEMMs (what
# vLLM-class engines reach with CUDA graphs and FlashAttention), 1 ms of launch/schedule/sample per
# step and a few microseconds per sequence of metadata. Stated, not measured (no GPU here).
GPU_EFF = Efficiency(bw=0.8, flops=0.6, step_overhead_s=1.0e-3, seq_overhead_s=5e-6)
# Placeholder for this CPU until bench/sim_calibrate.py has run (its output file overrides it).
CPU_EFF_DEFAULT = Efficiency(bw=0.45, flops=0.35, step_overhead_s=0.012, seq_overhead_s=2e-4)

CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "bench" / "results" / "sim_calibration.json"


@dataclass(frozen=True)
class Profile:
    name: str
    model: ModelShape
    hw: Hardware
    eff: Efficiency
    kv_pool_tokens: int  # device KV pool the engine would get
    block_size: int = 16
    attention: AttentionCost | None = None  # measured decode attention per layer; None: from the roofline
    host_bytes: float | None = None  # host tier for GPU sizing (None: scenarios.gpu_sizing's 128 GiB)
    disk_bytes: float | None = None  # disk tier for GPU sizing (None: no disk tier)

    def cost_model(self) -> CostModel:
        return CostModel(self.model, self.hw, self.eff, self.attention, self.block_size)


def gpu_pool_tokens(model: ModelShape, hw: Hardware, utilization: float = 0.9,
                    activations: float = 2e9) -> int:
    """vLLM-style sizing: a share of device memory, minus weights and an activation reserve."""
    free = hw.mem_bytes * utilization - (model.matmul_params + model.head_params * 2) * model.dtype_bytes
    return int((free - activations) // model.kv_bytes_per_token) // 16 * 16


def load_cpu_calibration(path: str | Path | None = None) -> tuple[Efficiency, int, str, str]:
    """(efficiency, weight bytes, KV dtype, attention backend's cost name) fitted by bench/sim_calibrate.py;
    placeholders when it has not run (the engine's default here: an fp32 model, bf16 KV). A fit made before
    the KV dtype was recorded ran fp32 KV; one made before the backend was recorded priced decode attention as
    the torch path's."""
    p = Path(path) if path else CALIBRATION_FILE
    if not p.exists():
        return CPU_EFF_DEFAULT, 4, "bfloat16", "torch"
    data = json.loads(p.read_text())
    fit = data["fit"]
    eff = Efficiency(**{k: float(fit[k]) for k in ("bw", "flops", "step_overhead_s", "seq_overhead_s",
                                                   "token_overhead_s", "chunk_overhead_s", "kv_bw",
                                                   "attn_flops") if k in fit})
    return (eff, int(data.get("dtype_bytes", 4)), str(data.get("kv_dtype", "float32")),
            str(data.get("attention_backend", "torch")))


def get_profile(name: str, calibration: str | Path | None = None,
                kv_pool_tokens: int | None = None) -> Profile:
    if name == "cpu":  # the engine's dtype here ('auto' resolves to float32 on this CPU) comes with the fit
        eff, dtype_bytes, kv_dtype, backend = load_cpu_calibration(calibration)
        # decode attention priced as the engine's backend runs it (the C++ kernel where it is built)
        prof = Profile("cpu", replace(SMOLLM2_135M, dtype_bytes=dtype_bytes), THIS_CPU, eff,
                       kv_pool_tokens=24576,
                       attention=cost_for(kv_dtype, backend))
    elif name == "h100":
        prof = Profile("h100", LLAMA3_8B, H100, GPU_EFF, gpu_pool_tokens(LLAMA3_8B, H100))
    elif name == "h200":
        prof = Profile("h200", LLAMA3_8B, H200, GPU_EFF, gpu_pool_tokens(LLAMA3_8B, H200))
    elif name == "h200-70b-fp8":  # W5's GPU scale: ~166k tokens of pool, host 256 GiB, disk 2 TB
        prof = Profile(name, LLAMA31_70B_FP8, H200_FP8, GPU_EFF, gpu_pool_tokens(LLAMA31_70B_FP8, H200_FP8),
                       host_bytes=256 * 2**30, disk_bytes=2e12)
    else:
        raise ValueError(f"unknown profile {name!r} ({', '.join(PROFILES)})")
    return replace(prof, kv_pool_tokens=kv_pool_tokens) if kv_pool_tokens else prof


PROFILES = ("cpu", "h100", "h200", "h200-70b-fp8")
