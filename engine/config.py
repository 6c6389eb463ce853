"""Engine configuration: model, dtype, KV pool and scheduler limits (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvloop.engine.kv.config import KVConfig
from kvloop.engine.scheduler.config import SCHED_MODES, SchedulerConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int4", "int8")
CASCADE_MODES = ("auto", "off", "always")


@dataclass
class EngineConfig:
    model: str | None = None  # None: the embedded SmolLM2; else a .gguf file or an HF directory
    dtype: str = "auto"  # auto: bf16 on GPU and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32
    device: str = "cpu"
    block_size: int = 16
    kv_cache_tokens: int = 65536  # device pool size in tokens
    # Pool sizes in memory units (the operator's spec); when set they override the token counts, converted
    # with the model's KV bytes per token once the model is known (EngineCore.apply_pool_sizes).
    device_pool_mib: float | None = None
    host_pool_mib: float | None = None
    disk_pool_gib: float | None = None
    attention_backend: str = "auto"
    # KV storage dtype. auto: the model dtype when it is 16-bit; under an fp32 model chosen by dtype=auto (a
    # CPU without native bf16) bf16, halving the bytes a decode step reads, accumulated in fp32; an explicit
    # dtype=float32 keeps fp32 KV (the exact path).
    kv_dtype: str = "auto"
    # Shared-prefix decode: auto cascades a group where the measured cost model says it is faster; always
    # cascades every shared prefix of two or more rows (tests); off reads every row's whole context.
    cascade: str = "auto"
    quantization: str = "none"  # none (exact) | int4 | int8: weight-only, for decode-sized steps (model/linear.py)
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVConfig = field(default_factory=KVConfig)  # prefix cache mode, admission, watermark, tiers
    progress: bool = True
    control_file: str | None = None  # shared-memory control block with the sidecar; None: no feedback loop
    control_stale_after_s: float = 120.0  # sidecar targets older than this give way to the defaults above
    # static | continuous | continuous+lru | codesign: sets scheduler.mode and kv.mode together (static runs
    # without a prefix cache); None leaves both as configured
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}")
        if self.kv_dtype not in DTYPES:
            raise ValueError(f"kv_dtype must be one of {DTYPES}")
        if self.cascade not in CASCADE_MODES:
            raise ValueError(f"cascade must be one of {CASCADE_MODES}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")
        if self.mode is not None:
            if self.mode not in SCHED_MODES[1:]:
                raise ValueError(f"mode must be one of {SCHED_MODES[1:]}")
            self.scheduler.mode = self.mode
            self.kv.mode = "continuous" if self.mode == "static" else self.mode

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size
