"""KV cache settings; `mode` names the cache policy (scheduler.policy) that the manager asks (pure Python).

- `continuous`: no prefix cache; released blocks are freed at once.
- `continuous+lru`: prefix cache with plain LRU eviction; no admission gate, no watermark, no lower tiers.
- `codesign`: GCLOCK eviction in two classes (blocks that have not earned their place under the heat gate
  leave first), the retention watermark, host and disk tiers filled lazily on eviction.
The cache policies are the registry's (`scheduler.policy.cache_policy_names()`), read when needed, so
that a policy registered after import is accepted too."""

from __future__ import annotations

from dataclasses import dataclass

from kvloop.engine.core import defaults as D
from kvloop.engine.core.config_options import option
from kvloop.engine.core.policy import CachePolicy, get_cache_policy


@dataclass
class KVConfig:
    mode: str = "codesign"
    admit_min_requests: int = option(D.ADMIT_MIN_REQUESTS, setting="kv_cache.admit_min_requests",
                                     help="device gate: distinct requests that referenced a block's hash "
                                          "before it keeps its place under pressure (others are evicted "
                                          "first)")
    host_admit_min_requests: int = option(D.HOST_ADMIT_MIN_REQUESTS,
                                          setting="kv_cache.host_admit_min_requests",
                                          help="host tier gate, in the same unit: a block evicted from the "
                                               "device is copied to the host while it has room; when full, "
                                               "blocks below it displace only each other and leave first")
    disk_admit_min_requests: int = 2  # the same for the disk tier (device or host evictions)
    min_prefix_tokens: int = option(D.MIN_PREFIX_TOKENS, setting="kv_cache.min_prefix_tokens",
                                    help="shorter prefix matches are misses (codesign only)")
    watermark: float = option(D.RETENTION_WATERMARK, setting="kv_cache.retention_watermark",
                              help="share of the device pool kept for cached blocks; where the live knob "
                                   "starts")
    host_cache_tokens: int = D.HOST_POOL_TOKENS.value  # 0 disables the host tier
    disk_dir: str | None = option(None, setting="kv_cache.disk_dir",
                                  help="disk tier directory; none disables it")
    disk_cache_tokens: int = 262144
    disk_queue_size: int = 64  # write-behind queue; a full queue drops the write (counted)
    ghost_entries: int = 65536  # bound of the ghost table (about 200 bytes per entry)
    gclock_max: int = 3  # GCLOCK counter ceiling
    regret_window: int = 4096  # an eviction is regretted if its hash is asked for within this many evictions

    def __post_init__(self) -> None:
        get_cache_policy(self.mode)  # raises ValueError naming the cache policies
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        for name in ("admit_min_requests", "host_admit_min_requests", "disk_admit_min_requests",
                     "ghost_entries",
                     "gclock_max", "regret_window", "disk_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.min_prefix_tokens, self.host_cache_tokens, self.disk_cache_tokens) < 0:
            raise ValueError("token counts must be >= 0")

    @property
    def cache_policy(self) -> CachePolicy:
        return get_cache_policy(self.mode)  # read per call: EngineConfig sets mode after construction

    @property
    def prefix_cache(self) -> bool:
        return self.cache_policy.prefix_cache

    @property
    def eviction(self) -> str:
        return self.cache_policy.eviction
