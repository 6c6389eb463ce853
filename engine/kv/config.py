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
from kvloop.engine.kv.event_hashes import HASH_KINDS
from kvloop.engine.kv.kv_events import ENCODINGS
from kvloop.engine.kv.remote_tier import check_url


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
    # The remote tier (kv.remote_mixin, kv.remote_tier), shared by engines: the store, its timeout, the gate
    # (distinct requests before a block is written; 1: every computed block, since a peer's first request
    # for it is the one a shared tier serves) and the write-behind queue's bound. The password comes from the
    # environment (KVLOOP_KV_REMOTE_PASSWORD), never a flag.
    kv_remote_url: str = option("", flag="--kv-remote-url", setting="kv_cache.remote_url",
                                help="remote KV tier shared by engines: redis://HOST:PORT/DB (Redis or "
                                     "Valkey; rediss:// for TLS, unix:///path.sock), password from the "
                                     "environment variable KVLOOP_KV_REMOTE_PASSWORD; run the store with "
                                     "maxmemory and maxmemory-policy allkeys-lru; empty: no remote tier")
    kv_remote_timeout_ms: float = option(D.KV_REMOTE_TIMEOUT_MS, flag="--kv-remote-timeout-ms",
                                         setting="kv_cache.remote_timeout_ms",
                                         help="remote KV store timeout for connecting and each reply; a "
                                              "store past it is down (misses) until it answers again")
    remote_admit_min_requests: int = 1
    remote_ttl_s: int = 0  # values expire after this many seconds (0: only the store's own eviction)
    remote_queue_mib: int = 256  # writes not yet sent, in MiB of K/V; past it a write is dropped (counted)
    ghost_entries: int = 65536  # bound of the ghost table (about 200 bytes per entry)
    gclock_max: int = 3  # GCLOCK counter ceiling
    regret_window: int = 4096  # an eviction is regretted if its hash is asked for within this many evictions
    # KV events for routers (kv/events_publisher.py), published where the manager lives
    kv_events_endpoint: str = option("", flag="--kv-events-endpoint", setting="kv_events.endpoint",
                                     help="publish KV cache events in vLLM's format (block stored / "
                                          "removed / all cleared) on a ZeroMQ PUB socket at this address, "
                                          "e.g. tcp://*:5557 (bound; an address without * is connected "
                                          "to); empty: off")
    kv_events_topic: str = option(D.KV_EVENTS_TOPIC, flag="--kv-events-topic", setting="kv_events.topic",
                                  help="the ZeroMQ topic of the KV events")
    kv_events_replay_endpoint: str = option("", flag="--kv-events-replay-endpoint",
                                            setting="kv_events.replay_endpoint",
                                            help="a ZeroMQ ROUTER address answering vLLM's replay requests "
                                                 "for the last 10,000 KV event batches; empty: no replay")
    kv_events_hash: str = option("kvloop", flag="--kv-events-hash", setting="kv_events.hash",
                                 choices=HASH_KINDS,
                                 help="the block hashes the events carry: kvloop (the engine's chain keys, "
                                      "for routers that hash token ids themselves) or vllm_sha256_cbor_64bit "
                                      "(vLLM's, as llm-d's precise prefix scorer recomputes them; "
                                      "kv/event_hashes.py)")
    kv_events_hash_seed: str = option("", flag="--kv-events-hash-seed", setting="kv_events.hash_seed",
                                      help="the seed of vllm_sha256_cbor_64bit's root hash (vLLM's "
                                           "PYTHONHASHSEED; llm-d's hashSeed)")
    kv_events_encoding: str = option("map", flag="--kv-events-encoding", setting="kv_events.encoding",
                                     choices=ENCODINGS,
                                     help="each event as a map tagged by \"type\" (what vllm-router and "
                                          "Dynamo decode) or as an array led by its tag (vLLM's array_like "
                                          "structs, what llm-d decodes); the batch is an array either way")

    def __post_init__(self) -> None:
        get_cache_policy(self.mode)  # raises ValueError naming the cache policies
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        for name in ("admit_min_requests", "host_admit_min_requests", "disk_admit_min_requests",
                     "ghost_entries",
                     "gclock_max", "regret_window", "disk_queue_size", "remote_admit_min_requests",
                     "remote_queue_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.min_prefix_tokens, self.host_cache_tokens, self.disk_cache_tokens) < 0:
            raise ValueError("token counts must be >= 0")
        if self.kv_remote_timeout_ms <= 0:
            raise ValueError("kv_remote_timeout_ms must be > 0")
        check_url(self.kv_remote_url)

    @property
    def cache_policy(self) -> CachePolicy:
        return get_cache_policy(self.mode)  # read per call: EngineConfig sets mode after construction

    @property
    def prefix_cache(self) -> bool:
        return self.cache_policy.prefix_cache

    @property
    def eviction(self) -> str:
        return self.cache_policy.eviction
