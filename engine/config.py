"""Engine configuration: model, dtype, KV pool and scheduler limits (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvloop.engine.core import defaults as D
from kvloop.engine.core.config_options import option
from kvloop.engine.core.policy import get_policy, policy_names
from kvloop.engine.kernels.backend import backend_choices
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SchedulerConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "bf16", "int4", "int8")
CASCADE_MODES = ("auto", "off", "always")
COMPILE_MODES = ("auto", "on", "off")


@dataclass
class EngineConfig:
    # Fields declared with option() are also `kvloop` flags and engine.yaml keys
    # (engine/core/config_options.py).
    model: str | None = option(None, flag="--model", setting="model.path",
                               help="a .gguf file or HF directory (default: the embedded SmolLM2-135M)")
    dtype: str = option(D.DTYPE, flag="--dtype", setting="dtype", choices=DTYPES,
                        help="model dtype; auto: bf16 on GPUs and on CPUs with native bf16 "
                             "(AVX512-BF16/AMX), else float32")
    device: str = option(D.DEVICE, flag="--device", setting="device",
                         help="cpu, cuda, or auto (the GPU when there is one)")
    block_size: int = option(D.BLOCK_SIZE, flag="--block-size", setting="block_size",
                             help="KV block size in tokens")
    kv_cache_tokens: int = option(D.DEVICE_POOL_TOKENS, flag="--kv-cache-tokens",
                                  help="device KV pool size in tokens")
    # Pool sizes in memory units (the operator's spec); when set they override the token counts, converted
    # with the model's KV bytes per token once the model is known (EngineCore.apply_pool_sizes).
    device_pool_mib: float | None = option(None, setting="kv_cache.device_pool_mib",
                                           help="device KV pool in MiB (overrides kv_cache_tokens)")
    host_pool_mib: float | None = option(None, setting="kv_cache.host_pool_mib",
                                         help="host KV tier in MiB (overrides kv.host_cache_tokens)")
    disk_pool_gib: float | None = option(None, setting="kv_cache.disk_size_gib",
                                         help="disk KV tier in GiB (overrides kv.disk_cache_tokens)")
    attention_backend: str = option("auto", flag="--attention-backend", choices=backend_choices,
                                    help="attention kernels (engine/kernels/backend.py); auto: triton on "
                                         "CUDA, torch on the CPU")
    kv_dtype: str = option("auto", flag="--kv-dtype", setting="kv_dtype", choices=DTYPES,
                           help="KV cache storage. auto: the model dtype when it is 16-bit; under a float32 "
                                "model chosen by --dtype auto (a CPU without native bf16) bf16, halving the "
                                "bytes a decode step reads, accumulated in float32; an explicit --dtype "
                                "float32 keeps float32 KV (the exact path)")
    # Shared-prefix decode: auto cascades a group where the measured cost model says it is faster; always
    # cascades every shared prefix of two or more rows (tests); off reads every row's whole context.
    cascade: str = "auto"
    quantization: str = option("auto", flag="--quantization", setting="quantization", choices=QUANTIZATIONS,
                               help="weight format (model/linear.py): none: dense in the model dtype (the "
                                    "exact path); bf16: bf16 weights through a CPU kernel, float32 sums "
                                    "(under a bf16 model with AVX512-BF16: bf16 pairs in hardware, every "
                                    "step; built without it: the kernel for steps of up to 12 rows, dense "
                                    "bf16 weights above); int8: per-channel int8 weights, float32 arithmetic "
                                    "(CPU kernel, every step size; without it decode-sized steps only); "
                                    "int4: decode-sized steps; auto: bf16 under --dtype auto on a CPU when "
                                    "the kernel is built, else none")
    compile: str = option("auto", flag="--compile", setting="compile", choices=COMPILE_MODES,
                          help="compile the model's step with torch.compile (inductor's C++ backend; runner/"
                               "compiled_step.py) at start-up, artefacts cached on disk; auto: on a CPU "
                               "under --dtype auto, where it measured faster; an explicit dtype stays eager "
                               "(the exact path); without a C++ compiler the step runs eagerly")
    threads: int | None = option(None, flag="--threads",
                                 help="torch intra-op threads (default: torch's own choice)")
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVConfig = field(default_factory=KVConfig)  # prefix cache mode, admission, watermark, tiers
    progress: bool = True
    control_file: str | None = option(None, flag="--control-file", setting="control.path",
                                      help="shared-memory control block with the sidecar (the feedback loop; "
                                           "default: none, no feedback loop)")
    control_stale_after_s: float = option(D.CONTROL_STALE_AFTER_S, flag="--control-stale-after",
                                          setting="control.targets_stale_after_s",
                                          help="seconds after which sidecar targets give way to the "
                                               "configured values")
    mode: str | None = option(None, flag="--mode", setting="scheduler.mode", choices=policy_names,
                              help="batching and caching policy: sets the scheduler's and the KV manager's "
                                   "mode together, static without a prefix cache (default: codesign)")

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}")
        if self.kv_dtype not in DTYPES:
            raise ValueError(f"kv_dtype must be one of {DTYPES}")
        if self.cascade not in CASCADE_MODES:
            raise ValueError(f"cascade must be one of {CASCADE_MODES}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")
        if self.mode is not None:
            policy = get_policy(self.mode)  # raises ValueError naming the policies
            self.scheduler.mode = policy.name
            self.kv.mode = policy.cache.name

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size
