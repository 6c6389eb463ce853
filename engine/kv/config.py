"""KV cache policy settings and the three modes compared by the benchmarks (pure Python).

- `continuous`: no prefix cache; released blocks are freed at once.
- `continuous+lru`: prefix cache with plain LRU eviction; no admission gate, no watermark, no lower tiers.
- `codesign`: heat-gated admission, GCLOCK eviction, the retention watermark, host and disk tiers."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("continuous", "continuous+lru", "codesign")


@dataclass
class KVConfig:
    mode: str = "codesign"
    admit_min_requests: int = 3  # device gate: distinct requests that referenced a block's hash
    host_admit_min_requests: int = 1
    disk_admit_min_requests: int = 2
    min_prefix_tokens: int = 64  # shorter matches are misses (codesign only)
    watermark: float = 0.1  # share of the device pool kept for cached blocks; a live knob (set_watermark)
    host_cache_tokens: int = 65536  # 0 disables the host tier
    disk_dir: str | None = None  # None disables the disk tier
    disk_cache_tokens: int = 262144
    disk_queue_size: int = 64  # write-behind queue; a full queue drops the write (counted)
    ghost_entries: int = 65536  # bound of the ghost table (about 200 bytes per entry)
    gclock_max: int = 3  # GCLOCK counter ceiling
    regret_window: int = 4096  # an eviction is regretted if its hash is asked for within this many evictions

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"kv mode must be one of {MODES}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        for name in ("admit_min_requests", "host_admit_min_requests", "disk_admit_min_requests", "ghost_entries",
                     "gclock_max", "regret_window", "disk_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.min_prefix_tokens, self.host_cache_tokens, self.disk_cache_tokens) < 0:
            raise ValueError("token counts must be >= 0")

    @property
    def prefix_cache(self) -> bool:
        return self.mode != "continuous"

    @property
    def codesign(self) -> bool:
        return self.mode == "codesign"

    @property
    def eviction(self) -> str:
        return "gclock" if self.codesign else "lru"
