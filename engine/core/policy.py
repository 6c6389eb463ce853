"""Scheduling and cache policies by name: what each `mode` means, defined once (pure Python).

A mode name (`static`, `continuous`, `continuous+lru`, `codesign`) is what users pick: the CLI's --mode,
the settings file, the CRD's engine.scheduler.mode, the benchmark's systems, the metrics label. Code does
not test the name; it asks the policy for a behaviour. Every list of modes (CLI choices, settings file,
benchmark sizing, simulator, CRD enum) comes from `policy_names()`; a new policy is one `register` call.

A `Policy` is a scheduling policy over a `CachePolicy`. The KV manager is configured with the cache
policy's name (KVConfig.mode), so `static` runs over the no-cache `continuous` cache policy."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvloop.engine.core.cascade_scope import COMMON, NESTED

AUTO = "auto"  # SchedulerConfig.mode: follow the KV manager's cache policy of the same name


class Admission(Enum):
    FCFS = "fcfs"  # arrival order; the head of the queue waits for memory
    # prefix grouping with aging (grouping.py), the cache-aware gate (admission.py), and rows that join a
    # running group admitted past the batch cap within its priced budget
    GROUPED = "grouped"


@dataclass(frozen=True)
class CachePolicy:
    """How the KV manager keeps, orders and reuses blocks (engine/kv)."""

    name: str
    prefix_cache: bool  # full blocks are indexed and reused across requests; else freed on release
    eviction: str  # order over cached blocks, a name in kv.eviction: "lru" | "gclock"
    heat_gated: bool  # distinct requests per block counted (ghost table): blocks that have not earned
    # their place (admit_min_requests) leave first, and the lower tiers' thresholds apply
    retention_watermark: bool  # cached blocks keep the watermark share of the pool against allocations
    lower_tiers: bool  # the host tier caches prefixes, the disk tier exists, evicted blocks are demoted
    min_prefix: bool  # a match shorter than min_prefix_tokens is a miss (else one full block is a hit)


@dataclass(frozen=True)
class Policy:
    """A scheduling policy over a cache policy: what one `mode` selects."""

    name: str
    cache: CachePolicy
    admission: Admission
    static_batching: bool  # fixed batches, prompt + max_tokens reserved up front (static.py)
    cascade_groups: str  # decode cascade scope when SchedulerConfig.cascade_groups is auto (cascade_scope.py)
    feedback_loop: bool  # the coordinator steers it (batch cap, watermark) where a run asks for feedback

    @property
    def groups_prefixes(self) -> bool:
        return self.admission is Admission.GROUPED


NO_CACHE = CachePolicy("continuous", prefix_cache=False, eviction="lru", heat_gated=False,
                       retention_watermark=False, lower_tiers=False, min_prefix=False)
LRU_CACHE = CachePolicy("continuous+lru", prefix_cache=True, eviction="lru", heat_gated=False,
                        retention_watermark=False, lower_tiers=False, min_prefix=False)
CODESIGN_CACHE = CachePolicy("codesign", prefix_cache=True, eviction="gclock", heat_gated=True,
                             retention_watermark=True, lower_tiers=True, min_prefix=True)

_POLICIES: dict[str, Policy] = {}
_CACHE_POLICIES: dict[str, CachePolicy] = {}  # by name, from the registered policies (read on hot paths)


def register(policy: Policy) -> Policy:
    if policy.name in _POLICIES or policy.name == AUTO:
        raise ValueError(f"policy {policy.name!r} is already registered or reserved")
    known = _CACHE_POLICIES.setdefault(policy.cache.name, policy.cache)
    if known != policy.cache:
        raise ValueError(f"cache policy {policy.cache.name!r} is registered with other settings")
    _POLICIES[policy.name] = policy
    return policy


def policy_names() -> tuple[str, ...]:
    """Every mode a user may pick, in registration order (the benchmark's order of systems)."""
    return tuple(_POLICIES)


def scheduler_modes() -> tuple[str, ...]:
    """What SchedulerConfig.mode accepts: AUTO or a policy's name."""
    return (AUTO, *_POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"mode must be one of {policy_names()}, not {name!r}") from None


def cache_policy_names() -> tuple[str, ...]:
    """The cache policies the registered policies use (KVConfig.mode's values)."""
    return tuple(_CACHE_POLICIES)


def get_cache_policy(name: str) -> CachePolicy:
    try:
        return _CACHE_POLICIES[name]
    except KeyError:
        raise ValueError(f"kv mode must be one of {cache_policy_names()}, not {name!r}") from None


def resolve_policy(setting: str, cache_mode: str) -> Policy:
    """The scheduler's policy: the one named, or under AUTO the one named like the KV manager's cache
    policy."""
    return get_policy(cache_mode if setting == AUTO else setting)


# `continuous` and `static` run without a prefix cache, so no two rows share a block and the cascade scope
# is moot: nested, the runner's default. `continuous+lru` cascades only the prefix common to every decode
# row (vLLM's cascade, so the baseline stays honest); `codesign` any nested group its grouping brings
# together.
register(Policy("static", NO_CACHE, Admission.FCFS, static_batching=True, cascade_groups=NESTED,
                feedback_loop=False))
register(Policy("continuous", NO_CACHE, Admission.FCFS, static_batching=False, cascade_groups=NESTED,
                feedback_loop=False))
register(Policy("continuous+lru", LRU_CACHE, Admission.FCFS, static_batching=False, cascade_groups=COMMON,
                feedback_loop=False))
register(Policy("codesign", CODESIGN_CACHE, Admission.GROUPED, static_batching=False, cascade_groups=NESTED,
                feedback_loop=True))

DEFAULT_POLICY = "codesign"
